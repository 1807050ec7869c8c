"""A key column of an extension's type (citext, installed in public or in a schema off the
search_path) works everywhere and is compared by its own operators, so its indexes answer:
pg_catalog's `=` reached citext through the cast to text, case-sensitive and past the key's
index (a scan per statement)."""

from __future__ import annotations

import csv
import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from roles_helpers import role_maker
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from helpers import cli, database, database_name, plans
from pgembed import db
from pgembed.catalog import registry
from pgembed.contrib import sqlalchemy as orm
from pgembed.errors import NotFoundError
from pgembed.lifecycle import models, setup
from pgembed.sync import store, worker

DATA = Path(__file__).parent.parent / "data"


def _texts() -> list[str]:
    rows: list[str] = []
    for name in ("imdb-long-reviews.csv", "imdb-reviews-excerpt.csv"):
        with (DATA / name).open(newline="") as file:
            rows += [r["text"] for r in csv.DictReader(file)]
    return rows


TEXTS = _texts()


def key(i: int) -> str:
    """Keys whose case alternates: citext's order is not text's."""
    return f"{'Rr'[i % 2]}eviewer{i}@Example.com"


@pytest.fixture(scope="module", params=["public", "ext"])
def ext(request: pytest.FixtureRequest) -> str:
    """The schema citext is installed in: public, or ext, which is not on the search_path."""
    return str(request.param)


@pytest.fixture(scope="module")
def docs_template(server_url: str, template_url: str, ext: str) -> Iterator[str]:
    """Real reviews keyed by a citext e-mail, a chunked model with full-text search over them,
    embedded: once per schema of citext, each test changing a copy (docs_url)."""
    with database(server_url, "pgembed_test_citext", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ext}")
            conn.execute(f"CREATE EXTENSION citext SCHEMA {ext}")
            conn.execute(f"CREATE TABLE docs (email {ext}.citext PRIMARY KEY, body text)")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO docs VALUES (%s, %s)", [(key(i), t) for i, t in enumerate(TEXTS)]
                )
            request = models.AddRequest(
                "ck", "docs", "body", precision="fp32", long_texts="chunk", fulltext=True
            )
            models.add(conn, request)
        worker.Worker(url, worker.Options(once=True)).run()
        yield database_name(url)


@pytest.fixture
def docs_url(server_url: str, docs_template: str) -> Iterator[str]:
    with database(server_url, "c", template=docs_template) as url:
        yield url


@pytest.fixture
def docs(docs_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(docs_url) as conn:
        yield conn


@contextmanager
def only_by_index(conn: psycopg.Connection) -> Iterator[list[str]]:
    """The plans of the statements inside (nested ones too), run in a transaction where a table
    is read whole only when no index condition can find its rows (as on a large table)."""
    with plans(conn) as found, conn.transaction():
        for method in ("seqscan", "hashjoin", "mergejoin"):
            conn.execute(f"SET LOCAL enable_{method} = off")
        yield found


def unindexed(found: list[str], *tables: str) -> list[str]:
    """The plans that read one of `tables` without an index condition (auto_explain's text)."""
    scan = re.compile(rf"Scan.* on ({'|'.join(tables)})\b")
    bad = []
    for plan in found:
        lines = plan.splitlines()
        for i, line in enumerate(lines):
            if scan.search(line):
                depth = len(line) - len(line.lstrip())
                below = [x for x in lines[i + 1 :] if len(x) - len(x.lstrip()) > depth]
                detail = list(itertools.takewhile(lambda x: "->" not in x, below))
                # A bitmap scan's condition is its index's: "Recheck Cond".
                if not any(("Index Cond:" in x or "Recheck Cond:" in x) for x in detail):
                    bad.append(plan)
    return bad


def test_a_citext_key_is_embedded_searched_and_found_whatever_its_case(
    docs: psycopg.Connection, docs_url: str, ext: str
) -> None:
    missing = docs.execute("SELECT count(*) FROM docs WHERE embedding_ck IS NULL").fetchone()
    assert missing == (0,)
    chunked = docs.execute("SELECT count(DISTINCT key) FROM pgembed_ck_chunks").fetchone()
    assert chunked is not None and chunked[0] > 0
    with pgembed.Client(docs_url) as client:
        hits = client.search("ck", TEXTS[3][:200], k=5)
        assert key(3) in [h.key for h in hits]
        assert [h.similarity for h in hits] == sorted((h.similarity for h in hits), reverse=True)
        # A key in another case names the same row: it is found, and left out of its own hits.
        similar = client.similar("ck", key(3).upper(), k=5)
        assert len(similar) == 5 and key(3) not in [h.key for h in similar]
        assert key(5) in [h.key for h in client.hybrid_search("ck", TEXTS[5][:200], k=5)]
    # The triggers forget a deleted row's chunks and a changed text's old ones.
    docs.execute(
        f"DELETE FROM docs WHERE email OPERATOR({ext}.=) %s::{ext}.citext", (key(0).lower(),)
    )
    docs.execute(
        f"UPDATE docs SET body = 'Short now.' WHERE email OPERATOR({ext}.=) %s::{ext}.citext",
        (key(1),),
    )
    left = docs.execute(
        "SELECT count(*) FROM pgembed_ck_chunks WHERE key::text IN (%s, %s)", (key(0), key(1))
    ).fetchone()
    assert left == (0,)
    assert pgembed.sync_once(database_url=docs_url).written == 1


def test_every_key_comparison_takes_the_keys_index(docs: psycopg.Connection, ext: str) -> None:
    """With sequential scans made the last resort, a comparison the key's index cannot answer
    still scans: each statement must use the index, as it would on a large table."""
    spec = registry.get(docs, "ck")
    keys = [key(i) for i in (2, 4, 6)]
    stored = docs.execute(
        "SELECT email::text, embedding_ck FROM docs WHERE email::text = ANY(%s)", (keys,)
    )
    vectors = {k: v.to_numpy() for k, v in stored}
    with only_by_index(docs) as found:
        # The daemon's read, lock and write-back, and its chunks' replacement.
        rows = store.read(docs, spec, keys)
        assert sorted(r.key for r in rows) == sorted(keys)
        md5s = [r.text_md5 for r in rows]
        locked = store.lock(docs, spec, [r.key for r in rows], md5s)
        assert locked.same == dict.fromkeys(keys, True)
        mine = np.array([vectors[r.key] for r in rows])
        written = store.write(docs, spec, [r.key for r in rows], md5s, mine)
        assert written == set(keys)
        store.write_chunks(docs, spec, written, [(k, 1, vectors[k]) for k in keys])
        # A row's vector for pgembed.similar; the capture triggers' chunk clean-up.
        docs.execute("SELECT pgembed._row_vector_v1('ck', %s)", (key(8),))
        docs.execute(
            f"UPDATE docs SET body = 'Changed.' WHERE email OPERATOR({ext}.=) %s::{ext}.citext",
            (key(2),),
        )
        docs.execute(f"DELETE FROM docs WHERE email OPERATOR({ext}.=) %s::{ext}.citext", (key(4),))
    assert found and unindexed(found, "docs", "pgembed_ck_chunks") == []
    left = docs.execute(
        "SELECT key::text, count(*) FROM pgembed_ck_chunks WHERE key::text = ANY(%s) GROUP BY 1",
        (keys,),
    )
    assert dict(left.fetchall()) == {key(6): 1}


def test_the_chunk_tables_policy_compares_keys_as_their_type(
    docs: psycopg.Connection, docs_url: str, ext: str
) -> None:
    """A role under row-level security sees a chunk while it may see the chunk's row: the
    policy's probe of the row by its key is the comparison the test above shows its index
    answers, not one of the key's text (which reads the whole table for a search's chunks)."""
    policy = "SELECT qual FROM pg_policies WHERE tablename = 'pgembed_ck_chunks'"
    row = docs.execute(policy).fetchone()
    assert row is not None
    assert "email" in row[0] and "::text" not in row[0], row[0]
    # A chunk table made before has its policy made again by alter-table.
    docs.execute("DROP POLICY pgembed_row_visible ON pgembed_ck_chunks")
    docs.execute(
        "CREATE POLICY pgembed_row_visible ON pgembed_ck_chunks USING (EXISTS (SELECT "
        "t.embedding_ck FROM docs t WHERE t.email OPERATOR(pg_catalog.=) pgembed_ck_chunks.key))"
    )
    assert "::text" in docs.execute(policy).fetchone()[0]  # type: ignore[index]
    assert cli("--database-url", docs_url, "alter-table", "docs", "SELECT 1").exit_code == 0
    assert docs.execute(policy).fetchone() == row
    with role_maker(docs_url) as make:
        reader = make("reader")
        docs.execute(f"GRANT USAGE ON SCHEMA pgembed, {ext} TO {reader}")
        docs.execute(f"GRANT SELECT ON docs, pgembed_ck_chunks TO {reader}")
        total = docs.execute("SELECT count(*) FROM pgembed_ck_chunks").fetchone()
        with docs.transaction():
            docs.execute(f"SET LOCAL ROLE {reader}")
            seen = docs.execute("SELECT count(*) FROM pgembed_ck_chunks").fetchone()
    assert seen == total and seen is not None and seen[0] > 0


def test_a_backfill_in_pages_queues_every_row_of_a_citext_key(
    docs: psycopg.Connection, ext: str
) -> None:
    """The pages follow the key's index order (citext's: without regard to case) and start past
    the last key by that same order: by text's `>`, a page ending at "reviewer1" skipped
    "Reviewer2"."""
    spec = registry.get(docs, "ck")
    docs.execute("UPDATE docs SET embedding_ck = NULL")
    docs.execute("DELETE FROM pgembed.queue")  # what the update queued
    assert setup.enqueue(docs, spec, setup.Reporter(), batch=2) == len(TEXTS)
    queued = docs.execute("SELECT count(*) FROM pgembed.queue WHERE model = 'ck'").fetchone()
    assert queued == (len(TEXTS),)


def test_a_domain_keys_comparison_is_never_looked_up_by_the_domain(db_url: str) -> None:
    """A key of a domain over citext is cast to citext on both sides: `OPERATOR(ext.=)` between
    the domain and citext found an `=` (mail, citext) that a role who may CREATE in ext added
    before citext's own, and ran it as the daemon, the searching role."""
    with db.connection(db_url) as conn, role_maker(db_url) as make:
        conn.execute("CREATE SCHEMA ext")
        conn.execute("CREATE EXTENSION citext SCHEMA ext")
        conn.execute("CREATE DOMAIN mail AS ext.citext CHECK (VALUE LIKE '%@%')")
        conn.execute("CREATE TABLE mails (id mail PRIMARY KEY, body text)")
        conn.execute("INSERT INTO mails VALUES ('A@x', 'one review'), ('b@X', 'two reviews')")
        models.add(conn, models.AddRequest("mailm", "mails", "body", precision="fp32"))
        worker.Worker(db_url, worker.Options(once=True)).run()
        other = make("other")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA ext TO {other}")
        conn.execute(f"SET ROLE {other}")
        conn.execute(
            "CREATE FUNCTION ext.f(mail, ext.citext) RETURNS boolean LANGUAGE plpgsql AS "
            "$$BEGIN RAISE NOTICE 'ran as %', current_user; RETURN $1::text = $2::text; END$$"
        )
        conn.execute(
            "CREATE OPERATOR ext.= (FUNCTION = ext.f, LEFTARG = mail, RIGHTARG = ext.citext)"
        )
        conn.execute("RESET ROLE")
        said: list[str] = []
        conn.add_notice_handler(lambda diag: said.append(str(diag.message_primary)))
        spec = registry.get(conn, "mailm")
        assert [r.key for r in store.read(conn, spec, ["a@X"])] == ["A@x"]  # the daemon's read
        similar = conn.execute("SELECT key FROM pgembed.similar('mailm', 'A@X', 5)").fetchall()
        assert similar == [("b@X",)]
        assert said == []


def test_the_sqlalchemy_helpers_match_a_citext_key_as_citext(
    docs: psycopg.Connection, docs_url: str, ext: str
) -> None:
    """Hits are matched to their rows by the key type's `=` (before: as the VALUES' varchar,
    by a hash join over the whole table), and a key given in another case names its row."""

    class Base(DeclarativeBase):
        pass

    class Doc(Base):
        __tablename__ = "docs"
        email: Mapped[str] = mapped_column(sa.Text, primary_key=True)
        body: Mapped[str | None]
        embedding_ck = mapped_column(Vector(384))

    engine = sa.create_engine(docs_url.replace("postgresql://", "postgresql+psycopg://", 1))
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        with Session(engine) as session:
            found = orm.nearest(session, Doc, "ck", TEXTS[3][:200], k=5)
            assert key(3) in [doc.email for doc, _ in found]
            similar = orm.similar_to(session, Doc, "ck", key(3).upper(), k=5)
            assert len(similar) == 5 and key(3) not in [doc.email for doc, _ in similar]
        joins = [s for s in statements if "pgembed_hits" in s]
        assert joins and all(f"OPERATOR({ext}.=)" in s for s in joins), joins
        # A row without a vector yet, named in another case: said so, not "no row".
        docs.execute("UPDATE docs SET body = 'Short.' WHERE email::text = %s", (key(9),))
        with Session(engine) as session, pytest.raises(NotFoundError, match="no ck vector yet"):
            orm.similar_to(session, Doc, "ck", key(9).upper(), k=5)
    finally:
        engine.dispose()
