"""What a watched table may not be (refused at `model add`), and what happens when a watched
table or column goes away afterwards (status marks the model broken, remove still works)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from helpers import REVIEWS, cli, run_cli
from pgembed.catalog import registry
from pgembed.contrib import sqlalchemy as orm
from pgembed.errors import UsageError
from pgembed.lifecycle import models, reindex, status


class Base(DeclarativeBase):
    pass


class Doc(Base):
    __tablename__ = "reviews"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str]
    embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


def add(
    conn: psycopg.Connection, name: str, table: str, column: str, key: str | None = None
) -> tuple[registry.ModelSpec, int]:
    return models.add(conn, models.AddRequest(name, table, column, key=key, precision="fp32"))


def test_a_unique_key_that_allows_null_is_refused(db_url: str, conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE public.codes (code text UNIQUE, body text)")
    with pytest.raises(UsageError, match="allows NULL: make it NOT NULL"):
        add(conn, "minilm", "codes", "body", key="code")
    result = cli(
        "--database-url",
        db_url,
        "model",
        "add",
        "m",
        "--table",
        "codes",
        "--column",
        "body",
        "--key",
        "code",
    )
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "SET NOT NULL" in result.output
    assert not registry.exists(conn, "m")
    conn.execute("ALTER TABLE public.codes ALTER COLUMN code SET NOT NULL")
    spec, _ = add(conn, "minilm", "codes", "body", key="code")
    assert spec.key_column == "code"


def test_a_partitioned_table_is_refused_with_advice_that_works(
    conn: psycopg.Connection, db_url: str
) -> None:
    conn.execute(
        "CREATE TABLE public.parted (id int PRIMARY KEY, body text) PARTITION BY RANGE (id)"
    )
    conn.execute(
        "CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (100)"
    )
    conn.execute("INSERT INTO parted VALUES (1, 'The battery died in an hour.')")
    with pytest.raises(UsageError, match=r"is partitioned: not supported .*concurrently"):
        add(conn, "minilm", "parted", "body")
    # A partition cannot take the model's column: refused the same way, not PostgreSQL's error.
    with pytest.raises(UsageError, match=r"is a partition of public.parted: not supported"):
        add(conn, "minilm", "parted_1", "body")
    assert not registry.exists(conn, "minilm")
    columns = conn.execute(
        "SELECT count(*) FROM pg_attribute "
        "WHERE attrelid IN ('public.parted'::regclass, 'public.parted_1'::regclass) AND attnum > 0"
    ).fetchone()
    assert columns == (4,)
    # The advice works: a plain copy of the key and the text takes the model.
    conn.execute("CREATE TABLE public.parted_texts AS SELECT id, body FROM public.parted")
    conn.execute("ALTER TABLE public.parted_texts ADD PRIMARY KEY (id)")
    add(conn, "minilm", "parted_texts", "body")
    assert pgembed.sync_once(database_url=db_url).written == 1


def test_a_table_with_inheritance_children_is_refused(
    conn: psycopg.Connection, db_url: str
) -> None:
    """A query of the parent reads its children's rows, whose writes its triggers never see."""
    conn.execute("CREATE TABLE public.par (id int PRIMARY KEY, body text)")
    conn.execute("CREATE TABLE public.chi () INHERITS (public.par)")
    result = cli(
        "--database-url", db_url, "model", "add", "m", "--table", "par", "--column", "body"
    )
    assert result.exit_code == 2, result.output
    assert "public.par has inheritance children (public.chi): not supported" in result.output
    assert result.output.count("\n") == 1 and not registry.exists(conn, "m")
    conn.execute("ALTER TABLE public.chi NO INHERIT public.par")  # the advice works
    add(conn, "m", "par", "body")


def test_an_inheritance_child_made_later_is_never_searched(
    db_url: str, conn: psycopg.Connection
) -> None:
    """A child made after `model add`: its rows, whose writes the triggers never see, are never
    served (an audit's forged row in a child came back at similarity 1.0), while the table's
    own rows still are; the daemon skips the model and status says why."""
    conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY, body text)")
    conn.cursor().executemany("INSERT INTO public.reviews VALUES (%s, %s)", REVIEWS)
    add(conn, "minilm", "reviews", "body")
    assert pgembed.sync_once(database_url=db_url).written == len(REVIEWS)
    conn.execute("CREATE TABLE public.more_reviews () INHERITS (public.reviews)")
    conn.execute(
        "INSERT INTO public.more_reviews SELECT 999, '', embedding_minilm FROM reviews WHERE id = 1"
    )
    conn.execute(  # a child's key need not differ from the table's
        "INSERT INTO public.more_reviews SELECT 1, 'a child row', embedding_minilm "
        "FROM reviews WHERE id = 1"
    )
    searches = {
        "search": "SELECT key FROM pgembed.search('minilm', "
        "(SELECT embedding_minilm FROM ONLY reviews WHERE id = 1), 3)",
        "filtered": "SELECT key FROM pgembed.search('minilm', "
        '(SELECT embedding_minilm FROM ONLY reviews WHERE id = 1), 3, \'{"id": {"$gte": 0}}\')',
        "similar": "SELECT key FROM pgembed.similar('minilm', '2', 30)",
    }
    for name, query in searches.items():
        keys = [key for (key,) in conn.execute(query).fetchall()]
        assert keys and "999" not in keys, name
    # The front ends join the hits to the table (a review found a child's row twice under key 1).
    text = REVIEWS[0][1]
    with pgembed.Client(db_url) as client:
        hits = client.search("minilm", text, k=3)
    assert len(hits) == 3 and [hit.text for hit in hits].count("a child row") == 0, hits
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with Session(engine) as session:
        found = orm.nearest(session, Doc, "minilm", text, k=3)
    engine.dispose()
    assert [doc.id for doc, _ in found] == [hit.key for hit in hits]
    assert all(doc.body != "a child row" for doc, _ in found)
    (report,) = status.all_status(conn)
    assert "has inheritance children (public.more_reviews)" in report["broken"]


def test_a_reindex_whose_table_breaks_stops_and_says_why(
    db_url: str, conn: psycopg.Connection
) -> None:
    """A reindex's own fill, with the table broken since it began (here an inheritance child),
    stops in one line instead of waiting for ever on a model its worker skips (the audit's
    `pgembed reindex` logged the skip six times a second until killed); once mended, it goes on."""
    conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY, body text)")
    conn.cursor().executemany("INSERT INTO public.reviews VALUES (%s, %s)", REVIEWS)
    add(conn, "minilm", "reviews", "body")
    url = ("--database-url", db_url)
    started = cli(*url, "model", "alter", "minilm", "--max-seq-length", "64", "--no-wait")
    assert started.exit_code == 0, started.output
    conn.execute("CREATE TABLE public.more_reviews () INHERITS (public.reviews)")
    stopped = run_cli(*url, "reindex", "minilm", timeout=90)
    assert stopped.returncode == 2, stopped.stderr
    (line,) = [line for line in stopped.stderr.splitlines() if "error" in line]
    assert line == (
        "pgembed: error: the reindex of minilm cannot go on: table public.reviews has inheritance "
        "children (public.more_reviews): not supported (every query of it reads their rows too, "
        "which its triggers do not capture: their text changes would keep old vectors); watch "
        "each table of its own, or detach them (`ALTER TABLE child NO INHERIT parent`) (or give "
        "it up: `pgembed reindex minilm --abort`)"
    ), stopped.stderr
    shadow = registry.shadow(conn, "minilm")
    assert shadow is not None
    conn.execute("ALTER TABLE public.more_reviews NO INHERIT public.reviews")
    finished = cli(*url, "reindex", "minilm")
    assert finished.exit_code == 0, finished.output
    assert registry.get(conn, "minilm").max_seq_length == 64
    # A fill that outlived its reindex (switched in, or given up, by another process) says so,
    # not that the shadow's column is gone and the model should be removed (a review's).
    assert reindex.cannot_go_on(conn, shadow) == (
        f"the reindex of minilm to version {shadow.version} was given up or switched in by "
        "another process meanwhile: `pgembed status` says where it stands"
    )


@pytest.mark.parametrize("kind", ["STORED", "VIRTUAL"])
def test_a_generated_text_column_is_refused(conn: psycopg.Connection, kind: str) -> None:
    conn.execute(
        f"CREATE TABLE public.gen (id int PRIMARY KEY, title text, "
        f"body text GENERATED ALWAYS AS (upper(title)) {kind})"
    )
    with pytest.raises(UsageError, match="is GENERATED: watch a real column"):
        add(conn, "minilm", "gen", "body")
    spec, _ = add(conn, "minilm", "gen", "title")  # its source column is watchable
    assert spec.text_column == "title"


BREAKAGES = {
    "dropped table": ("DROP TABLE public.reviews", "table public.reviews no longer exists"),
    "dropped vector column": (
        "ALTER TABLE public.reviews DROP COLUMN embedding_minilm CASCADE",  # its update trigger too
        "has no column 'embedding_minilm' any more",
    ),
    "renamed text column": (
        "ALTER TABLE public.reviews RENAME COLUMN body TO content",
        "has no column 'body' any more",
    ),
    # Its rows are read with the table's, but not captured (an audit's child row kept the vector
    # of its old text for ever).
    "an inheritance child": (
        "CREATE TABLE public.more_reviews () INHERITS (public.reviews)",
        "has inheritance children (public.more_reviews): not supported",
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_model_is_reported_and_removable(
    db_url: str, conn: psycopg.Connection, breakage: str
) -> None:
    conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY, body text)")
    conn.cursor().executemany("INSERT INTO public.reviews VALUES (%s, %s)", REVIEWS)
    add(conn, "minilm", "reviews", "body")
    conn.execute("CREATE TABLE public.notes (id int PRIMARY KEY, body text)")
    conn.execute("INSERT INTO public.notes VALUES (1, 'a note')")
    add(conn, "other", "notes", "body")
    conn.execute("INSERT INTO pgembed.inbox (model, key, seq) VALUES ('minilm', '99', 1)")
    conn.execute("INSERT INTO pgembed.failures VALUES ('minilm', '1', 5, 'boom')")
    conn.execute("INSERT INTO pgembed.truncated VALUES ('minilm', '2')")
    statement, reason = BREAKAGES[breakage]
    conn.execute(statement)

    report = {m["name"]: m for m in status.all_status(conn)}
    assert reason in report["minilm"]["broken"]
    assert report["minilm"]["rows_total"] is None and report["minilm"]["queued"] == 9
    assert report["other"]["broken"] is None and report["other"]["rows_total"] == 1
    printed = cli("--database-url", db_url, "status")
    assert printed.exit_code == 0, printed.output
    assert "minilm: BROKEN: " in printed.output and reason in printed.output
    assert "other: " in printed.output

    removed = cli("--database-url", db_url, "model", "remove", "minilm")
    assert removed.exit_code == 0, removed.output
    assert not registry.exists(conn, "minilm") and registry.exists(conn, "other")
    kept = conn.execute(
        "SELECT (SELECT count(*) FROM pgembed.queue WHERE model = 'minilm') "
        "+ (SELECT count(*) FROM pgembed.inbox WHERE model = 'minilm') "
        "+ (SELECT count(*) FROM pgembed.failures WHERE model = 'minilm') "
        "+ (SELECT count(*) FROM pgembed.truncated WHERE model = 'minilm') "
        "+ (SELECT count(*) FROM pgembed.model_versions WHERE name = 'minilm')"
    ).fetchone()
    assert kept == (0,)
    leftovers = conn.execute(
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgembed_minilm_%'), "
        "(SELECT count(*) FROM pg_class WHERE relname LIKE 'pgembed_minilm_%'), "
        "(SELECT count(*) FROM pg_attribute WHERE attname = 'embedding_minilm' "
        "AND NOT attisdropped)"
    ).fetchone()
    assert leftovers == (0, 0, 0)


def test_rows_written_while_the_text_column_was_renamed_are_embedded_after_it_is_back(
    db_url: str, conn: psycopg.Connection
) -> None:
    """A rename breaks the model (status says so) but loses no change: rows inserted and texts
    updated meanwhile are queued by key, and embedded once the column has its name back."""
    conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY, body text)")
    conn.cursor().executemany("INSERT INTO public.reviews VALUES (%s, %s)", REVIEWS)
    add(conn, "minilm", "reviews", "body")
    assert pgembed.sync_once(database_url=db_url).written == len(REVIEWS)
    conn.execute("ALTER TABLE public.reviews RENAME COLUMN body TO content")
    conn.execute("INSERT INTO public.reviews VALUES (100, 'Arrived broken, refund refused.')")
    conn.execute("INSERT INTO public.reviews VALUES (101, ' ')")  # blank: judged at the claim
    conn.execute("UPDATE public.reviews SET content = 'Now it squeaks.' WHERE id = 1")
    assert pgembed.sync_once(database_url=db_url).written == 0  # broken: nothing served
    conn.execute("ALTER TABLE public.reviews RENAME COLUMN content TO body")
    result = pgembed.sync_once(database_url=db_url)
    assert (result.written, result.failed) == (2, 0)
    missing = conn.execute(
        "SELECT id FROM public.reviews WHERE embedding_minilm IS NULL ORDER BY id"
    ).fetchall()
    assert missing == [(101,)]
    left = conn.execute(
        "SELECT (SELECT count(*) FROM pgembed.queue), (SELECT count(*) FROM pgembed.inbox)"
    ).fetchone()
    assert left == (0, 0)
    with pgembed.Client(db_url) as client:  # row 1's vector is its new text's
        assert client.search("minilm", "Now it squeaks.", k=1)[0].key == 1


# Those a search cannot read past (an inheritance child's rows are read with the table's: the
# search goes on, while the daemon skips the model and status says why).
@pytest.mark.parametrize("breakage", [b for b in BREAKAGES if b != "an inheritance child"])
def test_a_search_of_a_broken_model_names_the_model_and_the_way_out(
    db_url: str, conn: psycopg.Connection, breakage: str
) -> None:
    conn.execute("CREATE TABLE public.reviews (id int PRIMARY KEY, body text)")
    conn.cursor().executemany("INSERT INTO public.reviews VALUES (%s, %s)", REVIEWS)
    add(conn, "minilm", "reviews", "body")
    assert pgembed.sync_once(database_url=db_url).written == len(REVIEWS)
    conn.execute(BREAKAGES[breakage][0])

    searched = cli("--database-url", db_url, "query", "it broke", "--model", "minilm")
    assert searched.exit_code == 1
    [line] = searched.output.strip().splitlines()
    assert line.startswith("pgembed: error: model 'minilm' cannot read its table: ")
    assert line.endswith("(renamed or dropped since `model add`: `pgembed status` says what to do)")
    with pgembed.Client(db_url) as client, pytest.raises(pgembed.DatabaseError, match="cannot"):
        client.similar("minilm", 1)
