"""Row-level security: a role finds a row through pgembed (chunk windows, the SQL helpers,
Client, `pgembed serve`, the ORM) only if the table's policy shows it that row, and a daemon
that the policy hides rows from leaves their work queued and says why."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from psycopg import sql
from roles_helpers import as_role, role_maker
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from helpers import post_json
from pgembed import db, migrate, roles
from pgembed.catalog import registry
from pgembed.contrib import sqlalchemy as orm
from pgembed.errors import NotFoundError
from pgembed.lifecycle import models, setup
from pgembed.serve.api import Api
from pgembed.serve.server import SearchServer
from pgembed.sync import store


@pytest.fixture
def make_role(db_url: str) -> Iterator[Callable[..., str]]:
    with role_maker(db_url) as make:
        yield make


def _long(topic: str) -> str:
    """A text longer than MiniLM's window: its later windows land in the chunk table."""
    return " ".join(f"Paragraph {i}: notes on {topic}." for i in range(90))


SECRET = "the confidential merger price and the acquisition of the rival company"
PUBLIC = "the battery of the phone and how long it lasts"


class Base(DeclarativeBase):
    pass


class Doc(Base):
    __tablename__ = "docs"
    id: Mapped[str] = mapped_column(primary_key=True)
    tenant: Mapped[str]
    body: Mapped[str]
    embedding_whole: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


def _tenants(conn: psycopg.Connection, make_role: Callable[..., str]) -> tuple[str, str, str]:
    """docs under a policy that shows each role the rows of its tenant; alice's rows are about
    batteries, bob's about a secret merger, each long enough to be chunked. Returns alice, bob
    and a reader without any grant on docs."""
    roles.create(conn)
    alice, bob = make_role("alice", f"IN ROLE {roles.READER}"), make_role("bob")
    nobody = make_role("nobody", f"IN ROLE {roles.READER}")
    conn.execute("CREATE TABLE docs (id text PRIMARY KEY, tenant text NOT NULL, body text)")
    conn.execute("ALTER TABLE docs ENABLE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY tenant ON docs USING (tenant = current_user)")
    for role in (alice, bob):
        conn.execute(sql.SQL("GRANT SELECT ON docs TO {}").format(sql.Identifier(role)))
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32", fulltext=True))
    models.add(
        conn, models.AddRequest("whole", "docs", "body", precision="fp32", long_texts="chunk")
    )
    rows = [(f"{alice}-{i}", alice, f"{_long(PUBLIC)} Part {i}.") for i in range(3)]
    rows += [(f"secret-{i}", bob, f"{_long(SECRET)} Part {i}.") for i in range(5)]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s, %s)", rows)
    return alice, bob, nobody


def _everything_pgembed_has(conn: psycopg.Connection) -> list[str]:
    """Every table and view of schema pgembed, and every chunk table, quoted."""
    rows = conn.execute(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'v', 'm', 'p') "
        "AND (n.nspname = 'pgembed' OR c.relname LIKE 'pgembed\\_%%\\_chunks')"
    ).fetchall()
    return [name for (name,) in rows]


def test_a_tenant_finds_only_its_rows_through_every_path(
    db_url: str, make_role: Callable[..., str]
) -> None:
    with db.connection(db_url) as conn:
        alice, _, nobody = _tenants(conn, make_role)
        relations = _everything_pgembed_has(conn)
    assert pgembed.sync_once(database_url=db_url).written == 2 * 8
    alice_url = as_role(db_url, alice)
    with pgembed.Client(db_url) as client:
        query = client.embed("whole", [SECRET], queries=True)[0]
    with db.connection(db_url) as conn:  # bob's rows do have chunks on the secret topic
        row = conn.execute("SELECT count(*) FROM pgembed_whole_chunks WHERE key LIKE 'secret-%%'")
        assert row.fetchone() != (0,)

    # Plain SQL, as alice and as a reader with no grant on docs: every pgembed object.
    for role in (alice, nobody):
        with db.connection(as_role(db_url, role)) as conn:
            for relation in relations:
                try:
                    seen = conn.execute(f"SELECT * FROM {relation}").fetchall()
                except psycopg.errors.InsufficientPrivilege:
                    continue
                assert "secret-" not in repr(seen), (role, relation)
            try:
                nearest = conn.execute(
                    "SELECT key FROM pgembed_whole_chunks ORDER BY embedding <=> %s LIMIT 5",
                    (query,),
                ).fetchall()
            except psycopg.errors.InsufficientPrivilege:
                assert role == nobody
            else:
                assert all(key.startswith(alice) for (key,) in nearest), nearest

    # The SQL helpers.
    with db.connection(alice_url) as conn:
        for model in ("minilm", "whole"):
            hits = conn.execute(
                "SELECT key FROM pgembed.search(%s, %s, 10)", (model, query)
            ).fetchall()
            assert hits and all(key.startswith(alice) for (key,) in hits)
        hits = conn.execute(
            "SELECT key FROM pgembed.hybrid_search('minilm', %s, 'merger acquisition', 10)",
            (query,),
        ).fetchall()
        assert all(key.startswith(alice) for (key,) in hits)
        with pytest.raises(psycopg.errors.NoDataFound):
            conn.execute("SELECT * FROM pgembed.similar('whole', 'secret-1', 3)")
    # Client.
    with pgembed.Client(alice_url) as client:
        for model in ("minilm", "whole"):
            assert all(str(h.key).startswith(alice) for h in client.search(model, SECRET, k=10))
        hybrid = client.hybrid_search("minilm", "merger acquisition", k=10)
        assert all(str(h.key).startswith(alice) for h in hybrid)
        assert all(
            str(h.key).startswith(alice) for h in client.similar("whole", f"{alice}-0", k=10)
        )
    # `pgembed serve`.
    api = Api(alice_url)
    api.warm()
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        for body in (
            {"text": SECRET, "model": "whole", "k": 10},
            {"text": "merger acquisition", "model": "minilm", "k": 10, "hybrid": True},
            {"similar_to": f"{alice}-0", "model": "whole", "k": 10},
        ):
            status, answer = post_json(f"{served.url}/search", body)
            assert status == 200, answer
            assert all(str(hit["key"]).startswith(alice) for hit in answer["hits"]), answer
        status, answer = post_json(
            f"{served.url}/search", {"similar_to": "secret-1", "model": "whole"}
        )
        assert status == 404 and "secret" not in repr(answer).replace("secret-1", "")
    finally:
        served.stop()
    # The ORM.
    engine = sa.create_engine(alice_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session:
            found: list[tuple[Any, float]] = orm.nearest(session, Doc, "whole", SECRET, k=10)
            assert found and all(doc.tenant == alice for doc, _ in found)
            near = orm.similar_to(session, Doc, "whole", f"{alice}-0", k=10)
            assert all(doc.tenant == alice for doc, _ in near)
    finally:
        engine.dispose()


def test_a_tenant_shown_no_row_finds_nothing_rather_than_an_error(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A role whose policy shows it no row was told `model 'minilm' has no vectors yet: run
    pgembed sync` of a table whose every row had its vector."""
    with db.connection(db_url) as conn:
        _tenants(conn, make_role)
        carol = make_role("carol", f"IN ROLE {roles.READER}")
        conn.execute(sql.SQL("GRANT SELECT ON docs TO {}").format(sql.Identifier(carol)))
    assert pgembed.sync_once(database_url=db_url).written == 2 * 8
    with pgembed.Client(as_role(db_url, carol)) as client:
        for model in ("minilm", "whole"):
            assert client.search(model, SECRET, k=5) == []
        assert client.hybrid_search("minilm", "merger acquisition", k=5) == []
    with db.connection(db_url) as conn:  # a table without vectors still says so
        conn.execute("UPDATE docs SET embedding_minilm = NULL")
        conn.execute("DELETE FROM pgembed.queue")
    with pgembed.Client(db_url) as client, pytest.raises(NotFoundError, match="no vectors yet"):
        client.search("minilm", SECRET, k=5)


def test_a_role_granted_other_columns_reads_no_chunk(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """Column grants: a role that may read docs' keys and tenants, not its text nor vectors, is
    refused the chunks' vectors as it is the vector column (an audit found it could search them:
    semantic search over text it may not read)."""
    with db.connection(db_url) as conn:
        alice, _, _ = _tenants(conn, make_role)
        columns = make_role("columns", f"IN ROLE {roles.READER}")
        conn.execute(sql.SQL("GRANT SELECT (id, tenant) ON docs TO {}").format(
            sql.Identifier(columns)))  # fmt: skip
        conn.execute(sql.SQL("CREATE POLICY everything ON docs TO {} USING (true)").format(
            sql.Identifier(columns)))  # fmt: skip
    assert pgembed.sync_once(database_url=db_url).written == 2 * 8
    with db.connection(as_role(db_url, columns)) as conn:
        assert len(conn.execute("SELECT id FROM docs").fetchall()) == 8
        for statement in (
            "SELECT embedding_whole FROM docs",
            "SELECT key, embedding FROM pgembed_whole_chunks",
            "SELECT count(*) FROM pgembed_whole_chunks",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with db.connection(as_role(db_url, alice)) as conn:  # alice may: her own rows' chunks
        seen = conn.execute("SELECT DISTINCT key FROM pgembed_whole_chunks").fetchall()
    assert len(seen) == 3 and all(key.startswith(alice) for (key,) in seen)


def _chunk_policy(conn: psycopg.Connection) -> tuple[bool, str] | None:
    row = conn.execute(
        "SELECT c.relrowsecurity, pg_get_expr(p.polqual, p.polrelid) FROM pg_class c "
        "JOIN pg_policy p ON p.polrelid = c.oid WHERE c.oid = 'pgembed_whole_chunks'::regclass "
        "AND p.polname = 'pgembed_row_visible'"
    ).fetchone()
    return (row[0], row[1]) if row else None


def test_migration_0017_makes_chunk_tables_follow_the_column_grants(db_url: str) -> None:
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
        request = models.AddRequest("whole", "docs", "body", precision="fp32", long_texts="chunk")
        models.add(conn, request)
        made = _chunk_policy(conn)
        # As 0015 made the policy: the key alone.
        conn.execute("DROP POLICY pgembed_row_visible ON pgembed_whole_chunks")
        conn.execute(
            "CREATE POLICY pgembed_row_visible ON pgembed_whole_chunks USING (EXISTS ("
            "SELECT FROM docs t WHERE t.id OPERATOR(pg_catalog.=) pgembed_whole_chunks.key))"
        )
        assert _chunk_policy(conn) != made
        conn.execute("DELETE FROM pgembed.migrations WHERE version = 17")
        migrate.migrate(conn)
        assert made is not None and "embedding_whole" in made[1]
        assert _chunk_policy(conn) == made


def test_migration_0015_puts_the_policy_on_chunk_tables_made_before(db_url: str) -> None:
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
        request = models.AddRequest("whole", "docs", "body", precision="fp32", long_texts="chunk")
        models.add(conn, request)
        # As a chunk table was before 0015.
        conn.execute("DROP POLICY pgembed_row_visible ON pgembed_whole_chunks")
        conn.execute("ALTER TABLE pgembed_whole_chunks DISABLE ROW LEVEL SECURITY")
        conn.execute("DELETE FROM pgembed.migrations WHERE version = 15")
        migrate.migrate(conn)
        row = conn.execute(
            "SELECT c.relrowsecurity, p.polname FROM pg_class c "
            "JOIN pg_policy p ON p.polrelid = c.oid WHERE c.oid = 'pgembed_whole_chunks'::regclass"
        ).fetchone()
    assert row == (True, "pgembed_row_visible")


def test_the_chunks_stay_behind_the_tables_policy_after_a_key_type_change(
    db_url: str, make_role: Callable[..., str]
) -> None:
    with db.connection(db_url) as conn:
        alice, _, _ = _tenants(conn, make_role)
    assert pgembed.sync_once(database_url=db_url).written == 2 * 8
    chunks = "SELECT key, chunk, embedding::text FROM pgembed_whole_chunks ORDER BY 1, 2"
    with db.connection(db_url) as conn:
        before = conn.execute(chunks).fetchall()
    # The chunk table's policy names the key column: alter-table lifts it and makes it again.
    statement = "ALTER TABLE docs ALTER COLUMN id TYPE varchar(64)"
    altered = pgembed.alter_table("docs", statement, database_url=db_url)
    assert altered.key_types["whole"][1] == "character varying(64)"
    with db.connection(db_url) as conn:
        assert conn.execute(chunks).fetchall() == before
    with db.connection(as_role(db_url, alice)) as conn:
        seen = conn.execute("SELECT DISTINCT key FROM pgembed_whole_chunks").fetchall()
    assert seen and all(key.startswith(alice) for (key,) in seen)


def _hidden_from_the_daemon(conn: psycopg.Connection, make_role: Callable[..., str]) -> str:
    """docs under row-level security whose only policy is for an application role: a daemon
    role's URL (a pgembed_daemon member, no BYPASSRLS), with 45 rows queued."""
    roles.create(conn)
    app = make_role("app")
    conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
    conn.execute("ALTER TABLE docs ENABLE ROW LEVEL SECURITY")
    conn.execute(
        sql.SQL("CREATE POLICY app ON docs TO {} USING (true)").format(sql.Identifier(app))
    )
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    conn.execute("INSERT INTO docs SELECT g, 'review ' || g FROM generate_series(1, 45) g")
    return make_role("daemon", f"IN ROLE {roles.DAEMON}")


def test_a_daemon_that_row_security_hides_rows_from_keeps_their_work(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """The audit's case: "0 written, 45 skipped" and an empty queue. Now the keys stay queued,
    status says why and what to grant, and the grant lets the daemon write them all."""
    with db.connection(db_url) as conn:
        daemon = _hidden_from_the_daemon(conn, make_role)
    daemon_url = as_role(db_url, daemon)
    result = pgembed.sync_once(database_url=daemon_url)
    assert (result.written, result.skipped) == (0, 0)
    (report,) = pgembed.status(database_url=daemon_url)
    assert report["queued"] == 45
    assert "row-level security on public.docs hides rows from role" in report["broken"]
    assert f"ALTER ROLE {daemon} BYPASSRLS" in report["broken"]
    with db.connection(db_url) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(daemon)))
    assert pgembed.sync_once(database_url=daemon_url).written == 45
    with db.connection(db_url) as conn:
        assert conn.execute("SELECT count(embedding_minilm) FROM docs").fetchone() == (45,)


def test_the_daemon_read_refuses_rows_row_security_would_hide(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """Row-level security switched on after the daemon checked: its read of the claimed keys
    fails (row_security = off) rather than return no rows, which would drop them."""
    with db.connection(db_url) as conn:
        daemon = _hidden_from_the_daemon(conn, make_role)
        spec = registry.get(conn, "minilm")
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security")
    with db.connection(as_role(db_url, daemon)) as conn, refused:
        store.read(conn, spec, ["1", "2"])


def test_queuing_existing_rows_never_skips_rows_a_policy_hides(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """`model add`'s batched enqueue by a role a policy hides rows from fails, in one error,
    instead of queuing only the rows that role sees (the others would never be embedded)."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        adder = make_role("adder", f"IN ROLE {roles.DAEMON}")
        conn.execute("CREATE TABLE docs (id text PRIMARY KEY, tenant text NOT NULL, body text)")
        conn.execute("ALTER TABLE docs ENABLE ROW LEVEL SECURITY")
        conn.execute("CREATE POLICY tenant ON docs USING (tenant = current_user)")
        conn.execute(sql.SQL("GRANT SELECT ON docs TO {}").format(sql.Identifier(adder)))
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        conn.execute(
            "INSERT INTO docs VALUES ('mine', %s, 'a review'), ('theirs', 'other', 'a review')",
            (adder,),
        )
        conn.execute("DELETE FROM pgembed.queue; DELETE FROM pgembed.inbox")
        spec = registry.get(conn, "minilm")
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security")
    with db.connection(as_role(db_url, adder)) as conn, refused:
        setup.enqueue(conn, spec, setup.Reporter())
    with db.connection(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
