"""Keys of every common type reach the worker intact, whatever the writer's session settings;
a key that changes is queued under its new value; the capture triggers' other outcomes."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql
from roles_helpers import as_role, role_maker

import pgembed
from helpers import cli
from pgembed import db
from pgembed.errors import UsageError
from pgembed.lifecycle import models

# (column type, three keys as SQL literals)
KEY_TYPES = {
    "integer": ("1", "2", "3"),
    "bigint": ("9007199254740993", "-5", "42"),
    "text": ("'a b'", "'ünï'", "'x''y'"),
    "uuid": (
        "'00000000-0000-0000-0000-000000000001'",
        "'b0b5c5c0-1111-4222-8333-944444444444'",
        "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
    ),
    "date": ("'2024-01-02'", "'2024-02-01'", "'1999-12-31'"),
    "timestamptz": (
        "'2024-01-02 03:04:05.123456+00'",
        "'2024-02-01 23:59:59+05:30'",
        "'2000-01-01 00:00:00-08'",
    ),
    "double precision": ("0.1", "1e300", "-2.5"),
    # format_type()'s "timestamp(3) without time zone" was refused as a key type once.
    "timestamp(3)": ("'2024-01-02 03:04:05.123'", "'2024-02-01 23:59:59'", "'1999-12-31 00:00:00'"),
}

# A writer whose session settings differ from the worker's in every way that changes key text.
WRITER_SETTINGS = (
    "SET datestyle = 'SQL, DMY'; SET timezone = 'Asia/Kolkata'; "
    "SET extra_float_digits = 0; SET intervalstyle = 'sql_standard'"
)


@pytest.mark.parametrize("key_type", ["integer[]", "text[]"])
def test_an_array_key_is_refused_by_name(db_url: str, key_type: str) -> None:
    """A key is one value: an array key's rows were queued but never read back (0 written)."""
    with db.connection(db_url) as conn:
        conn.execute(f"CREATE TABLE public.docs (id {key_type} PRIMARY KEY, body text)")
        conn.execute("INSERT INTO docs VALUES ('{1}', 'a text')")
        with pytest.raises(
            UsageError,
            match=rf"key column 'id' of public.docs is an array \({re.escape(key_type)}\)",
        ):
            models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        assert conn.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)


def vectors_missing(conn: psycopg.Connection, table: str = "docs") -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE embedding_minilm IS NULL").format(
        sql.Identifier(table)
    )
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else -1


def pending(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox ORDER BY 1"
    )
    return [key for (key,) in rows]


@pytest.mark.parametrize("key_type", list(KEY_TYPES))
def test_keys_survive_any_session_settings(db_url: str, key_type: str) -> None:
    a, b, c = KEY_TYPES[key_type]
    with db.connection(db_url) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE public.docs (id {} PRIMARY KEY, body text)").format(
                sql.SQL(key_type)
            )
        )
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    with psycopg.connect(db_url, autocommit=True) as writer:
        writer.execute(WRITER_SETTINGS)
        writer.execute(
            f"INSERT INTO docs VALUES ({a}, 'first text'), ({b}, 'second text'), "
            f"({c}, 'third text')"
        )
    assert pgembed.sync_once(database_url=db_url).written == 3
    with psycopg.connect(db_url, autocommit=True) as writer:
        writer.execute(WRITER_SETTINGS)
        writer.execute(f"UPDATE docs SET body = 'changed' WHERE id = {b}")
        writer.execute(f"DELETE FROM docs WHERE id = {c}")
    with db.connection(db_url) as conn:
        assert len(pending(conn)) == 1
    assert pgembed.sync_once(database_url=db_url).written == 1
    with db.connection(db_url) as conn:
        assert (vectors_missing(conn), pending(conn)) == (0, [])
        # Searches hand back keys the helpers accept again.
        key = conn.execute(
            "SELECT key FROM pgembed.search('minilm', (SELECT embedding_minilm "
            "FROM docs LIMIT 1), 1)"
        ).fetchone()
        assert key is not None
        assert conn.execute(
            "SELECT count(*) FROM pgembed.similar('minilm', %s, 2)", key
        ).fetchone() == (1,)


@pytest.fixture
def docs(conn: psycopg.Connection, db_url: str) -> psycopg.Connection:
    conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
    conn.execute("INSERT INTO docs VALUES (1, 'a good phone'), (2, 'a bad charger')")
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    pgembed.sync_once(database_url=db_url)
    return conn


def test_a_key_changed_while_queued_is_embedded_under_its_new_value(
    docs: psycopg.Connection, db_url: str
) -> None:
    docs.execute("INSERT INTO docs VALUES (3, 'a third review')")
    docs.execute("UPDATE docs SET id = 30 WHERE id = 3")
    assert pending(docs) == ["30"]
    assert pgembed.sync_once(database_url=db_url).written == 1
    assert (vectors_missing(docs), pending(docs)) == (0, [])


def test_a_key_change_of_an_embedded_row_keeps_its_vector(docs: psycopg.Connection) -> None:
    docs.execute("UPDATE docs SET id = 10 WHERE id = 1")
    assert (vectors_missing(docs), pending(docs)) == (0, [])


def test_white_space_only_texts_are_not_queued(docs: psycopg.Connection, db_url: str) -> None:
    blanks = ["\t\n ", "\u00a0\u00a0", "\u3000", "\u2003\u200b", "\ufeff "]
    with docs.cursor() as cur:
        cur.executemany(
            "INSERT INTO docs VALUES (%s, %s)", [(10 + i, t) for i, t in enumerate(blanks)]
        )
    docs.execute("UPDATE docs SET body = '\u3000 ' WHERE id = 1")
    assert pending(docs) == []
    docs.execute("UPDATE docs SET body = 'real words again' WHERE id = 10")
    assert pending(docs) == ["10"]
    assert pgembed.sync_once(database_url=db_url).written == 1


def test_a_vector_written_by_hand_is_replaced(docs: psycopg.Connection, db_url: str) -> None:
    before = docs.execute("SELECT embedding_minilm::text FROM docs WHERE id = 1").fetchone()
    docs.execute("UPDATE docs SET embedding_minilm = array_fill(0.5, ARRAY[384])::vector")
    assert vectors_missing(docs) == 2 and pending(docs) == ["1", "2"]
    assert pgembed.sync_once(database_url=db_url).written == 2
    after = docs.execute("SELECT embedding_minilm::text FROM docs WHERE id = 1").fetchone()
    assert after == before


def test_a_vector_inserted_by_hand_is_replaced(docs: psycopg.Connection, db_url: str) -> None:
    """An INSERT (or COPY) with a vector: cleared in the row write, as an UPDATE's is, and the
    row queued for its own text; a row without text keeps none (an audit's forged vector on a
    blank row was served for ever). The sync worker's flag and a replication apply keep theirs."""
    forged = "array_fill(0.5, ARRAY[384])::vector"
    docs.execute(f"INSERT INTO docs VALUES (3, 'a new row', {forged}), (4, '   ', {forged})")
    with docs.cursor() as cur, cur.copy("COPY docs (id, body, embedding_minilm) FROM STDIN") as c:
        c.write_row((5, "a copied row", "[" + ",".join(["0.5"] * 384) + "]"))
    assert vectors_missing(docs) == 3 and pending(docs) == ["3", "5"]
    assert pgembed.sync_once(database_url=db_url).written == 2
    assert vectors_missing(docs) == 1  # the blank row: no text, no vector
    for setting in ("pgembed.writing = on", "session_replication_role = replica"):
        with docs.transaction(force_rollback=True):
            docs.execute(f"SET LOCAL {setting}")
            docs.execute(f"INSERT INTO docs VALUES (6, '   ', {forged})")
            assert vectors_missing(docs) == 1, setting


def test_a_writer_with_only_its_table_privileges_inserts_vectors_that_are_cleared(
    docs: psycopg.Connection, db_url: str
) -> None:
    """The insert guard works for a writer granted nothing of pgembed's: its INSERT ... SELECT
    and COPY that carry vectors are written, without them, and queued."""
    with role_maker(db_url) as make:
        writer = make("writer")
        docs.execute(sql.SQL("GRANT SELECT, INSERT ON docs TO {}").format(sql.Identifier(writer)))
        with db.connection(as_role(db_url, writer)) as conn:
            conn.execute("INSERT INTO docs SELECT id + 10, body, embedding_minilm FROM docs")
            copy = "COPY docs (id, body, embedding_minilm) FROM STDIN"
            with conn.cursor() as cur, cur.copy(copy) as c:
                c.write_row((20, "a copied row", "[" + ",".join(["0.5"] * 384) + "]"))
    assert vectors_missing(docs) == 3 and pending(docs) == ["11", "12", "20"]


def test_the_owners_trigger_may_insert_into_another_watched_table_under_the_workers_flag(
    docs: psycopg.Connection, db_url: str
) -> None:
    """The worker's flag lasts its write-back's transaction, which runs the owner's triggers: one
    that inserts a row without a vector into another owner's watched table is no forgery (a
    review saw every batch fail on it)."""
    with role_maker(db_url) as make:
        owner, other = make("owner"), make("other")
        docs.execute("CREATE TABLE public.log (id serial PRIMARY KEY, body text)")
        models.add(docs, models.AddRequest("logm", "log", "body", precision="fp32"))
        for table, role in (("docs", owner), ("log", other)):
            docs.execute(
                sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                    sql.Identifier(table), sql.Identifier(role)
                )
            )
        docs.execute(sql.SQL("GRANT INSERT ON log TO {}").format(sql.Identifier(owner)))
        docs.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(owner)))
        docs.execute(
            sql.SQL("GRANT USAGE ON SEQUENCE log_id_seq TO {}").format(sql.Identifier(owner))
        )
        docs.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        docs.execute(
            "CREATE FUNCTION public.noted() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN INSERT INTO public.log (body) VALUES ('row ' || NEW.id || ' embedded'); "
            "RETURN NULL; END$$"
        )
        docs.execute(
            "CREATE TRIGGER noted AFTER UPDATE OF embedding_minilm ON docs "
            "FOR EACH ROW EXECUTE FUNCTION public.noted()"
        )
        docs.execute("RESET ROLE")
        docs.execute("UPDATE docs SET body = body || '!'")  # both rows queued again
        assert pgembed.sync_once(database_url=db_url).failed == 0
        assert vectors_missing(docs) == 0
        assert docs.execute("SELECT count(*) FROM log").fetchone() == (2,)
        docs.execute("DROP TABLE log CASCADE")
        docs.execute("ALTER TABLE docs OWNER TO CURRENT_USER")


def test_a_model_added_before_the_vector_guard_gets_it_at_migrate(
    docs: psycopg.Connection, db_url: str
) -> None:
    """A model of an older pgembed (no guard), or of one whose guard watched inserts only, gets
    the guard of inserts and updates at `pgembed migrate`, once."""
    guard = "SELECT tgenabled, (tgtype & 4) > 0, (tgtype & 16) > 0 FROM pg_trigger "
    guard += "WHERE tgname = 'pgembed_minilm_vec'"
    assert docs.execute(guard).fetchall() == [("A", True, True)]  # ALWAYS, INSERT, UPDATE
    older = (
        "DROP TRIGGER pgembed_minilm_vec ON docs",
        "CREATE TRIGGER pgembed_minilm_vec BEFORE INSERT ON docs FOR EACH ROW "
        "EXECUTE FUNCTION pgembed.capture_insert_vector_v1('minilm', 'embedding_minilm')",
    )
    unflagged = (  # this release's first guard: flagged writes without a vector not called for
        older[0],
        "CREATE TRIGGER pgembed_minilm_vec BEFORE INSERT OR UPDATE OF embedding_minilm ON docs "
        "FOR EACH ROW WHEN (NEW.embedding_minilm IS NOT NULL) "
        "EXECUTE FUNCTION pgembed.capture_insert_vector_v1('minilm', 'embedding_minilm')",
    )
    for made in (older[:1], older, unflagged):
        for statement in made:
            docs.execute(statement)
        result = cli("--database-url", db_url, "migrate")
        assert result.exit_code == 0, result.output
        assert "model minilm: a vector an INSERT brings into public.docs is now cleared" in (
            result.output
        )
        assert docs.execute(guard).fetchall() == [("A", True, True)]
    again = cli("--database-url", db_url, "migrate")
    assert again.output.strip() == "the pgembed schema is up to date"
    docs.execute("INSERT INTO docs VALUES (3, '   ', array_fill(0.5, ARRAY[384])::vector)")
    assert vectors_missing(docs) == 1


def test_the_writing_flag_is_honoured_for_the_owner_and_the_daemon_only(
    docs: psycopg.Connection, db_url: str
) -> None:
    """`SET pgembed.writing = on` (the sync worker's flag) lets a member of the table's owner load
    vectors; a writer that sets it gets an error instead of a vector that sticks (an audit's
    forged vectors on blank rows were served for ever, and a vector-only update was never
    queued). A text change under the flag is still captured, its vector cleared."""
    forged = "array_fill(0.5, ARRAY[384])::vector"
    with role_maker(db_url) as make:
        owner, writer = make("owner"), make("writer")
        docs.execute(sql.SQL("ALTER TABLE docs OWNER TO {}").format(sql.Identifier(owner)))
        grant = sql.SQL("GRANT SELECT, INSERT, UPDATE ON docs TO {}")
        docs.execute(grant.format(sql.Identifier(writer)))
        refused = []
        with db.connection(as_role(db_url, writer)) as conn:
            conn.execute("SET pgembed.writing = on")
            for statement in (
                f"INSERT INTO docs VALUES (3, '   ', {forged})",
                f"INSERT INTO docs VALUES (4, NULL, {forged})",
                f"UPDATE docs SET embedding_minilm = {forged} WHERE id = 1",
                "UPDATE docs SET embedding_minilm = NULL WHERE id = 1",  # never queued again
                f"UPDATE docs SET body = 'new', embedding_minilm = {forged} WHERE id = 1",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
                    conn.execute(statement)
                refused.append(str(caught.value))
            conn.execute("UPDATE docs SET body = 'a new text' WHERE id = 2")
        assert vectors_missing(docs) == 1 and pending(docs) == ["2"]
        with db.connection(as_role(db_url, owner)) as conn:
            conn.execute("SET pgembed.writing = on")
            conn.execute(f"INSERT INTO docs VALUES (5, 'loaded', {forged}), (6, '  ', {forged})")
            conn.execute(f"UPDATE docs SET embedding_minilm = {forged} WHERE id = 1")
        # Kept; an inserted row with text is queued all the same (the insert trigger). Status
        # counts the vectors of rows with a text: 1 and 5 of 1, 2 and 5, not the blank row's.
        assert vectors_missing(docs) == 1 and pending(docs) == ["2", "5"]
        (report,) = pgembed.status(database_url=db_url)
        assert (report["rows_total"], report["rows_embedded"]) == (3, 2)
        docs.execute("ALTER TABLE docs OWNER TO CURRENT_USER")
    assert refused[0].startswith(f"pgembed model minilm: role {writer} may not write vectors")
    assert len(set(refused)) == 1


def test_replica_mode_writes_are_captured(docs: psycopg.Connection) -> None:
    # Logical replication's apply workers and pg_restore --disable-triggers's sessions run
    # with session_replication_role = replica: the capture triggers fire ALWAYS.
    with docs.transaction():
        docs.execute("SET LOCAL session_replication_role = replica")
        docs.execute("UPDATE docs SET body = 'replicated text' WHERE id = 2")
        docs.execute("INSERT INTO docs VALUES (3, 'replicated row')")
    assert pending(docs) == ["2", "3"]
    assert vectors_missing(docs) == 2  # the old vector is never served for the new text


def test_a_renamed_column_spares_the_application(docs: psycopg.Connection) -> None:
    notices: list[str] = []
    docs.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    # A renamed text column: the writes go on and are queued by key, to be judged once it is back.
    docs.execute("ALTER TABLE docs RENAME COLUMN body TO content")
    docs.execute("INSERT INTO docs VALUES (3, 'a new row')")
    docs.execute("UPDATE docs SET content = 'new words' WHERE id = 1")
    docs.execute("DELETE FROM docs WHERE id = 2")  # needs only the key: captured as ever
    assert notices == []
    assert pending(docs) == ["1", "3"]  # the delete took 2's entry away
    docs.execute("ALTER TABLE docs RENAME COLUMN content TO body")
    # A renamed vector column: an insert is queued (it needs only the key); an update goes on
    # uncaptured (its old vector cannot be cleared) and says so.
    docs.execute("ALTER TABLE docs RENAME COLUMN embedding_minilm TO saved")
    docs.execute("INSERT INTO docs VALUES (4, 'another row')")
    docs.execute("UPDATE docs SET body = 'other words' WHERE id = 1")
    # An insert bringing a vector keeps it, and says so (it cannot be cleared by its old name).
    docs.execute("INSERT INTO docs VALUES (5, 'a row', array_fill(0.5, ARRAY[384])::vector)")
    assert {"4", "5"} <= set(pending(docs))
    assert len(notices) == 2
    assert all(
        "has no column embedding_minilm any more (renamed or dropped?)" in n for n in notices
    )
    assert "`pgembed model remove minilm`" in notices[0]


def test_a_float_key_change_invisible_in_the_writers_digits_is_captured(
    conn: psycopg.Connection,
) -> None:
    conn.execute("CREATE TABLE public.docs (id double precision PRIMARY KEY, body text)")
    conn.execute("INSERT INTO docs VALUES (0.1, 'a text')")
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    conn.execute("DELETE FROM pgembed.queue")
    with conn.transaction():
        conn.execute("SET LOCAL extra_float_digits = 0")  # 0.1 and the new key print alike
        conn.execute("UPDATE docs SET id = 0.10000000000000002")
    assert pending(conn) == ["0.10000000000000002"]


def test_the_workers_flag_does_not_hide_a_new_text(docs: psycopg.Connection) -> None:
    with docs.transaction():
        docs.execute("SET LOCAL pgembed.writing = on")  # only vectors are the worker's
        docs.execute("UPDATE docs SET body = 'a new text' WHERE id = 1")
    assert pending(docs) == ["1"] and vectors_missing(docs) == 1


def test_a_replicated_vector_is_kept(docs: psycopg.Connection) -> None:
    # A subscriber receiving the vector column from its publisher keeps it.
    with docs.transaction():
        docs.execute("SET LOCAL session_replication_role = replica")
        docs.execute("UPDATE docs SET embedding_minilm = array_fill(0.5, ARRAY[384])::vector")
    assert (vectors_missing(docs), pending(docs)) == (0, [])
