"""`pgembed alter-table`: a watched column's type changes with the capture triggers lifted around
the statement, the vectors kept, and a text the statement changed embedded again. With the
application or the daemon at work meanwhile: test_alter_table_races.py."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest
from alter_helpers import synced, triggers, vectors

from daemon_helpers import assert_every_vector_matches_its_text
from helpers import REVIEWS, cli
from pgembed.catalog import naming, registry
from pgembed.lifecycle import models

# A review longer than MiniLM's window (~700 word pieces): a chunked model keeps its windows.
LONG = " ".join(f"Sentence {i} of a long review about a phone that breaks." for i in range(60))


def chunked_model(conn: psycopg.Connection, db_url: str) -> str:
    """Model minilm chunking long texts, synced, with review 1 long: its text."""
    conn.execute("UPDATE reviews SET body = %s WHERE id = 1", (LONG,))
    request = models.AddRequest("minilm", "reviews", "body", precision="fp32", long_texts="chunk")
    models.add(conn, request)
    synced(db_url)
    return LONG


# A chunk table's row security, its policy's expression and its key's type.
_CHUNK_POLICY = (
    "SELECT c.relrowsecurity, pg_get_expr(p.polqual, p.polrelid), "
    "format_type(a.atttypid, a.atttypmod) FROM pg_class c JOIN pg_policy p "
    "ON p.polrelid = c.oid JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'key' "
    "WHERE c.oid = '{}'::regclass"
)


def test_a_watched_columns_type_changes_and_the_vectors_stay(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    synced(db_url)
    before, made = vectors(reviews), triggers(reviews)
    assert sorted(naming.trigger_names(spec)) == made
    with pytest.raises(psycopg.errors.FeatureNotSupported):  # PostgreSQL, on its own
        reviews.execute("ALTER TABLE reviews ALTER COLUMN id TYPE bigint")
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN id TYPE bigint; "
        "ALTER TABLE reviews ALTER COLUMN body TYPE varchar(500)",
    )
    assert result.exit_code == 0, result.output
    assert "model minilm: key type integer -> bigint" in result.output
    assert "queued" not in result.output  # no text changed
    assert registry.get(reviews, "minilm").key_type == "bigint"
    assert vectors(reviews) == before and triggers(reviews) == made
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    # Capture goes on through the new triggers, and the daemon writes with the new key type.
    reviews.execute("UPDATE reviews SET body = 'A new text, after the new types.' WHERE id = 3")
    reviews.execute("INSERT INTO reviews VALUES (5000000000, 'A key past integer.', 3)")
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)
    hits = reviews.execute(
        "SELECT key FROM pgembed.search('minilm', (SELECT embedding_minilm FROM reviews "
        "WHERE id = 5000000000), 1)"
    ).fetchall()
    assert hits == [("5000000000",)]


def test_a_text_the_statement_changes_is_embedded_again(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    synced(db_url)
    reviews.execute(
        "INSERT INTO pgembed.failures (model, key, attempts, error) "
        "VALUES ('minilm', '8', 5, 'an old failure')"
    )
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN body TYPE varchar(40) USING left(body, 40); "
        "UPDATE reviews SET body = '' WHERE id = 8",
    )
    assert result.exit_code == 0, result.output
    cut = {key for key, text in REVIEWS if len(text) > 40} - {8}
    assert f"model minilm: {len(cut)} rows' text changed: queued to embed again" in result.output
    cleared = reviews.execute("SELECT id FROM reviews WHERE embedding_minilm IS NULL").fetchall()
    assert {key for (key,) in cleared} == cut | {8}  # and row 8, now blank
    queued = reviews.execute("SELECT key::integer FROM pgembed.queue").fetchall()
    assert {key for (key,) in queued} == cut
    assert reviews.execute("SELECT count(*) FROM pgembed.failures").fetchone() == (0,)
    reviews.execute("DELETE FROM reviews WHERE id = 8")
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)
    # The statement's text is the user's, whatever the connection's encoding.
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "UPDATE reviews SET body = 'Un café très bon, señor.' WHERE id = 7",
    )
    assert "1 rows' text changed" in result.output, result.output
    body = reviews.execute("SELECT body FROM reviews WHERE id = 7").fetchone()
    assert body == ("Un café très bon, señor.",)
    # A statement that clears or writes vectors: those rows are embedded again too.
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "UPDATE reviews SET embedding_minilm = NULL WHERE id = 1; "
        "UPDATE reviews SET embedding_minilm = (SELECT embedding_minilm FROM reviews WHERE id = 3) "
        "WHERE id = 2",
    )
    assert "model minilm: 2 rows' text changed" in result.output, result.output
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("ALTER TABLE reviews DROP COLUMN body", "model minilm: column 'body' does not exist"),
        ("ALTER TABLE reviews ALTER COLUMN body TYPE integer USING length(body)", "not text"),
        ("ALTER TABLE reviews ALTER COLUMN nope TYPE text", "the statement failed, nothing "),
        ("ALTR TABLE reviews", "the statement failed, nothing changed: syntax error"),
        (
            "ALTER TABLE reviews ALTER COLUMN embedding_minilm TYPE vector(385) USING NULL",
            "statement changed pgembed's column 'embedding_minilm' (vector(384) to vector(385))",
        ),
        ("ALTER TABLE reviews ADD COLUMN x int; COMMIT", "transaction commands"),
        ("ALTER TABLE reviews DROP COLUMN body; /* done */ COMMIT", "transaction commands"),
        (
            "ALTER TABLE reviews DROP CONSTRAINT reviews_pkey, ALTER COLUMN id TYPE bigint",
            "model minilm: key column 'id' of public.reviews is not unique",
        ),
        ("", "give the statement to run"),
        ("DROP TABLE reviews", "the statement dropped, renamed or moved table public.reviews"),
        ("ALTER TABLE reviews RENAME TO notes", "dropped, renamed or moved table public.reviews"),
    ],
)
def test_a_statement_that_would_break_a_model_changes_nothing(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str, statement: str, error: str
) -> None:
    synced(db_url)
    before, made = vectors(reviews), triggers(reviews)
    result = cli("--database-url", db_url, "alter-table", "reviews", statement)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and error in lines[0], result.output
    assert vectors(reviews) == before and triggers(reviews) == made
    columns = reviews.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'reviews'"
    ).fetchone()
    assert columns == (4,)
    reviews.execute("UPDATE reviews SET body = 'Still captured.' WHERE id = 2")
    assert reviews.execute("SELECT key FROM pgembed.queue").fetchall() == [("2",)]


def test_a_table_no_model_watches_is_refused(reviews: psycopg.Connection, db_url: str) -> None:
    result = cli("--database-url", db_url, "alter-table", "reviews", "SELECT 1")
    assert result.exit_code != 0
    assert "no model watches table public.reviews: run the statement yourself" in result.output


def test_a_chunked_models_text_column_changes_type_with_its_chunks_kept(
    reviews: psycopg.Connection, db_url: str
) -> None:
    long = chunked_model(reviews, db_url)
    # Not prepared: the key column's type changes under the statement.
    chunks = "SELECT key, chunk, embedding::text FROM pgembed_minilm_chunks ORDER BY 1, 2"
    before = reviews.execute(chunks, prepare=False).fetchall()
    assert len(before) > 1
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN body TYPE varchar(5000)",
    )
    assert result.exit_code == 0, result.output
    assert reviews.execute(chunks, prepare=False).fetchall() == before
    # The key's type changes too (PostgreSQL alone refused it: the chunk table's row policy
    # names the key column): the chunks take the new key type and stay, the policy is made again.
    policy = _CHUNK_POLICY.format("pgembed_minilm_chunks")
    (enabled, qual, key_type), *others = reviews.execute(policy, prepare=False).fetchall()
    assert enabled and not others and key_type == "integer"
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN id TYPE bigint",
    )
    assert result.exit_code == 0, result.output
    assert registry.get(reviews, "minilm").key_type == "bigint"
    assert reviews.execute(policy, prepare=False).fetchall() == [(True, qual, "bigint")]
    assert reviews.execute(chunks, prepare=False).fetchall() == before
    # A policy dropped by hand is made again, as a missing trigger is.
    reviews.execute("DROP POLICY pgembed_row_visible ON pgembed_minilm_chunks")
    result = cli("--database-url", db_url, "alter-table", "reviews", "SELECT 1")
    assert result.exit_code == 0, result.output
    assert reviews.execute(policy, prepare=False).fetchall() == [(True, qual, "bigint")]
    reviews.execute("UPDATE reviews SET body = %s WHERE id = 1", (long + " One more.",))
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)
    assert reviews.execute(chunks, prepare=False).fetchall() != before
    # Rows the statement deletes or rekeys lose their chunks, as the triggers would do.
    reviews.execute("UPDATE reviews SET body = %s WHERE id = 2", (long,))
    synced(db_url)
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "DELETE FROM reviews WHERE id = 1; UPDATE reviews SET id = 100 WHERE id = 2",
    )
    assert result.exit_code == 0, result.output
    synced(db_url)
    keys = {key for key, *_ in reviews.execute(chunks, prepare=False).fetchall()}
    assert keys == {100}
    assert_every_vector_matches_its_text(reviews)
    # A key type that writes keys otherwise (100 becomes 100.00): every row is embedded again,
    # and no chunk is left under a key no row has.
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN id TYPE numeric(12,2)",
    )
    assert result.exit_code == 0, result.output
    # The chunk keys take the key's type without its modifier (a cast to it never rounds), and
    # the policy compares the row's key cast to that type.
    numeric = qual.replace("(t.id = ", "((t.id)::numeric = ")
    assert reviews.execute(policy, prepare=False).fetchall() == [(True, numeric, "numeric")]
    assert reviews.execute(chunks, prepare=False).fetchall() == []
    synced(db_url)
    keys = {key for key, *_ in reviews.execute(chunks, prepare=False).fetchall()}
    assert keys == {Decimal("100.00")}
    assert_every_vector_matches_its_text(reviews)
    # text to integer has no cast ALTER TYPE may use on its own: the chunk keys go by their text.
    for statement in ("id TYPE text USING id::integer::text", "id TYPE integer USING id::integer"):
        result = cli(
            "--database-url",
            db_url,
            "alter-table",
            "reviews",
            f"ALTER TABLE reviews ALTER COLUMN {statement}",
        )
        assert result.exit_code == 0, result.output
        synced(db_url)
    assert {key for key, *_ in reviews.execute(chunks, prepare=False).fetchall()} == {100}
    assert reviews.execute(policy, prepare=False).fetchall() == [(True, qual, "integer")]
    assert_every_vector_matches_its_text(reviews)


def test_a_reindex_shadows_chunks_take_the_new_key_type_too(
    reviews: psycopg.Connection, db_url: str
) -> None:
    chunked_model(reviews, db_url)
    alter = ("model", "alter", "minilm", "--pooling", "cls", "--no-wait")
    assert cli("--database-url", db_url, *alter).exit_code == 0
    synced(db_url)  # the shadow's vectors and chunks
    (shadow,) = [s for s in registry.all_models(reviews) if s.name != "minilm"]
    live, next_ = "pgembed_minilm_chunks", naming.chunk_table_name(shadow)

    def chunks(table: str) -> list[tuple[object, ...]]:
        query = f"SELECT key, chunk, embedding::text FROM {table} ORDER BY 1, 2"
        return reviews.execute(query, prepare=False).fetchall()

    before = {table: chunks(table) for table in (live, next_)}
    assert before[live] and before[next_] and before[live] != before[next_]
    statement = "ALTER TABLE reviews ALTER COLUMN id TYPE bigint"
    result = cli("--database-url", db_url, "alter-table", "reviews", statement)
    assert result.exit_code == 0, result.output
    assert {s.name: s.key_type for s in registry.all_models(reviews)} == {
        "minilm": "bigint",
        shadow.name: "bigint",
    }
    for table in (live, next_):
        assert chunks(table) == before[table]
        (policy,) = reviews.execute(_CHUNK_POLICY.format(table), prepare=False).fetchall()
        assert policy[0] and policy[2] == "bigint"
    # The reindex ends on the shadow's chunks, which its triggers still clean up.
    result = cli("--database-url", db_url, "reindex", "minilm")
    assert result.exit_code == 0, result.output
    assert chunks(live) == before[next_]
    reviews.execute("DELETE FROM reviews WHERE id = 1")
    assert chunks(live) == []


def test_a_chunked_shadow_is_aborted_and_a_chunked_model_removed_with_its_shadow(
    reviews: psycopg.Connection, db_url: str
) -> None:
    """Each chunk table's row policy names its model's vector column: the chunk tables go
    before their columns, for a reindex aborted and for a model removed with its shadow."""
    chunked_model(reviews, db_url)
    alter = ("model", "alter", "minilm", "--pooling", "cls", "--no-wait")
    tables = "SELECT count(*) FROM pg_class WHERE relname LIKE 'pgembed\\_minilm%%chunks'"
    for ending in (("reindex", "minilm", "--abort"), ("model", "remove", "minilm")):
        assert cli("--database-url", db_url, *alter).exit_code == 0
        synced(db_url)  # the shadow's chunks
        assert reviews.execute(tables).fetchone() == (2,)
        result = cli("--database-url", db_url, *ending)
        assert result.exit_code == 0, result.output
    assert reviews.execute(tables).fetchone() == (0,)
    columns = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'reviews'::regclass "
    columns += "AND attname LIKE 'embedding%%' AND NOT attisdropped"
    assert reviews.execute(columns).fetchone() == (0,)
