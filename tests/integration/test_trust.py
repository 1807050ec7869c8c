"""Trust: no name pgembed calls resolves through a schema another role can write, and each role
(owner, daemon, application writer, reader) works with only the privileges the README gives it.

Roles are cluster-wide: each test makes its own with a random suffix and drops them after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import numpy as np
import psycopg
import pytest
from pgvector import Vector
from psycopg import sql
from roles_helpers import as_role, role_maker

import pgembed
from helpers import REVIEWS, cli, database
from pgembed import db, migrate, roles
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.search import topk
from pgembed.sync import store, worker

# A review longer than MiniLM's window (~700 word pieces): a chunked model keeps its windows.
LONG_REVIEW = (100, " ".join(f"Sentence {i} of a long review on its battery." for i in range(80)))


@pytest.fixture
def make_role(db_url: str) -> Iterator[Callable[..., str]]:
    """make_role(prefix, *options) -> a new NOLOGIN role's name; dropped with what it owns."""
    with role_maker(db_url) as make:
        yield make


# Overloads a role with CREATE on public plants to catch a superuser calling them: each records
# who called it and tries to make its owner a superuser. Types are the ones pgembed meets on a
# varchar table (varchar, text[]), where a public overload would beat pg_catalog's by type.
_TRAPS = """
CREATE TABLE public.hijacked (by_role text, via text);
GRANT INSERT ON public.hijacked TO PUBLIC;
CREATE FUNCTION public.pwn(via text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijacked VALUES (current_user, via);
    BEGIN
        EXECUTE format('ALTER ROLE %I SUPERUSER', '{owner}');
    EXCEPTION WHEN others THEN NULL;
    END;
END $$;
CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('unnest'); RETURN QUERY SELECT pg_catalog.unnest($1); END $$;
CREATE FUNCTION public.md5(varchar) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('md5'); RETURN pg_catalog.md5($1::text); END $$;
CREATE FUNCTION public.btrim(varchar) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('btrim'); RETURN pg_catalog.btrim($1::text); END $$;
CREATE FUNCTION public.left(varchar, integer) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('left'); RETURN pg_catalog.left($1::text, $2); END $$;
CREATE FUNCTION public.format(text, text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('format'); RETURN pg_catalog.format($1, $2, $3); END $$;
CREATE FUNCTION public.to_tsvector(regconfig, varchar) RETURNS tsvector LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('to_tsvector'); RETURN pg_catalog.to_tsvector($1, $2::text); END $$;
CREATE FUNCTION public.trap_eq(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('='); RETURN $1::text = $2::text; END $$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.trap_eq);
CREATE FUNCTION public.trap_ne(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('<>'); RETURN $1::text <> $2::text; END $$;
CREATE OPERATOR public.<> (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.trap_ne);
-- Parameters psycopg sends as int2/int4 next to oid columns, float8 / int4, int ^ int.
CREATE FUNCTION public.trap_oid_int(oid, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('oid = int4'); RETURN $1 = $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.trap_oid_int);
CREATE FUNCTION public.trap_oid_small(oid, smallint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('oid = int2'); RETURN $1 = $2::integer::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = smallint, FUNCTION = public.trap_oid_small);
CREATE FUNCTION public.trap_oid_regclass(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('oid = regclass'); RETURN $1 = $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.trap_oid_regclass);
CREATE FUNCTION public.trap_pow(integer, integer) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn('^'); RETURN power($1, $2); END $$;
CREATE OPERATOR public.^ (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.trap_pow);
CREATE FUNCTION public.trap_div(double precision, integer) RETURNS double precision
LANGUAGE plpgsql AS $$ BEGIN PERFORM public.pwn('/'); RETURN $1 / $2::float8; END $$;
CREATE OPERATOR public./ (LEFTARG = double precision, RIGHTARG = integer,
    FUNCTION = public.trap_div);
"""


def test_search_path_hijack_leaves_the_role_powerless(
    db_url: str, make_role: Callable[..., str]
) -> None:
    mallory = make_role("mallory")
    with db.connection(db_url) as conn:
        # Before PostgreSQL 15 every role may CREATE in public; pgvector lives there.
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(mallory)))
        conn.execute(
            "CREATE TABLE docs (id varchar(20) PRIMARY KEY, body varchar(2000), tag varchar(10))"
        )
        conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO PUBLIC")
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(mallory)))
        conn.execute(_TRAPS.replace("{owner}", mallory).encode())
        conn.execute("RESET ROLE")
        # The traps work: a superuser session with the default search_path falls into them.
        with psycopg.connect(db_url, autocommit=True) as naive:
            naive.execute("BEGIN")
            naive.execute("SELECT md5('x'::varchar)")
            assert naive.execute("SELECT count(*) FROM public.hijacked").fetchone() == (1,)
            naive.execute("ROLLBACK")
        conn.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(mallory)))

        # Everything pgembed does, as a superuser: add, capture, sync, every search, status.
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        models.add_fulltext_index(conn, "minilm")
        whole = models.AddRequest("whole", "docs", "body", precision="fp32", long_texts="chunk")
        models.add(conn, whole)  # a chunked model: its chunk table, joined to docs by key
        conn.execute(
            "INSERT INTO docs SELECT id::text, body, 'tag' || id %% 2 FROM (VALUES "
            + ", ".join(f"({i}, %s)" for i, _ in [*REVIEWS, LONG_REVIEW])
            + ") AS v(id, body)",
            [body[:2000] for _, body in [*REVIEWS, LONG_REVIEW]],
        )
        conn.execute("UPDATE docs SET body = body || ' Really.' WHERE id::text = '1'")
        conn.execute("UPDATE docs SET id = '10' WHERE id::text = '2'")
        conn.execute("DELETE FROM docs WHERE id::text = '3'")
    assert pgembed.sync_once(database_url=db_url).written == 2 * len(REVIEWS)
    with db.connection(db_url) as conn:  # a failed attempt that is not the last: its backoff
        conn.execute("UPDATE docs SET body = 'again' WHERE id::text = '5'")
        (claim,) = store.claim(conn, "minilm", "w", 1, 60)
        assert not store.fail(conn, "minilm", claim, "boom", max_attempts=5)
    with pgembed.Client(db_url) as client:
        assert client.search("minilm", "battery life", k=3)
        assert client.search("minilm", "battery", k=3, filter={"tag": "tag1", "id": {"$ne": "5"}})
        assert client.hybrid_search("minilm", "battery", k=3, filter={"tag": {"$in": ["tag1"]}})
        assert client.similar("minilm", "1", k=2)
        assert client.search("whole", "battery", k=3, filter={"tag": "tag1"})
        vectors = client.embed("whole", ["battery life"], queries=True)
    with db.connection(db_url) as conn:  # eval's and tune's exact and indexed searches
        for model in ("minilm", "whole"):
            spec = registry.get(conn, model)
            assert topk.exact(conn, spec, vectors, 3) and topk.indexed(conn, spec, vectors, 3, 40)
        assert conn.execute("SELECT count(*) FROM pgembed_whole_chunks").fetchone() != (0,)
    pgembed.status(database_url=db_url)
    # The SQL helpers, called from a session with the default search_path, public first. (This
    # test's own statements compare keys as text: `id = '1'` on varchar would itself fall in.)
    with psycopg.connect(db_url, autocommit=True) as user:
        user.execute("SET search_path = public, pg_catalog")
        vector = user.execute("SELECT embedding_minilm FROM docs WHERE id::text = '1'").fetchone()
        assert vector is not None
        user.execute("SELECT * FROM pgembed.search('minilm', %s::vector, 3)", vector)
        user.execute(
            "SELECT * FROM pgembed.search('minilm', %s::vector, 3, '{\"tag\": \"tag1\"}')", vector
        )
        user.execute("SELECT * FROM pgembed.similar('minilm', '1', 3, '{\"tag\": \"tag1\"}')")
        user.execute("SELECT * FROM pgembed.hybrid_search('minilm', %s::vector, 'battery')", vector)
        user.execute("SELECT * FROM pgembed.search('whole', %s::vector, 3)", vector)
        user.execute("UPDATE docs SET body = 'changed' WHERE id::text = '4'")
        user.execute("UPDATE docs SET id = '40' WHERE id::text = '4'")
        user.execute("INSERT INTO docs VALUES ('20', 'one more', 'tag0')")
        user.execute("DELETE FROM docs WHERE id::text = '20'")
        user.execute("TRUNCATE docs")

        assert user.execute("SELECT * FROM public.hijacked").fetchall() == []
        row = user.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (mallory,))
        assert row.fetchone() == (False,)


def test_each_role_works_with_only_its_grants(
    db_url: str, make_role: Callable[..., str], empty_db_url: str
) -> None:
    # make_role before empty_db_url: the database goes first, then the roles that owned in it.
    new_role = make_role
    owner = new_role("owner", "CREATEROLE")
    with db.connection(empty_db_url) as conn:
        conn.execute("CREATE EXTENSION vector")  # or pgvector's trusted install by the owner
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(urlsplit(empty_db_url).path.lstrip("/")), sql.Identifier(owner)
            )
        )
        conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text, stars integer)")
        conn.execute(sql.SQL("ALTER TABLE reviews OWNER TO {}").format(sql.Identifier(owner)))
        # CREATE INDEX wants CREATE on the table's schema, even from the table's owner.
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(owner)))
    owner_url = as_role(empty_db_url, owner)
    with db.connection(owner_url) as conn:
        migrate.migrate(conn, create_roles=True)
        request = models.AddRequest(
            "minilm", "reviews", "body", precision="fp32", long_texts="chunk"
        )
        models.add(conn, request)
        # As if the model came before the roles: the next migrate grants the daemon its columns.
        conn.execute(
            "REVOKE SELECT (id, body, embedding_minilm), UPDATE (embedding_minilm) ON reviews "
            "FROM pgembed_daemon"
        )
        migrate.migrate(conn)
    writer = new_role("writer")
    daemon = new_role("daemon", f"IN ROLE {roles.DAEMON}")
    with db.connection(empty_db_url) as conn:  # a superuser's grant: the daemon writes as owner
        conn.execute(
            sql.SQL("GRANT {} TO {} WITH INHERIT FALSE").format(
                sql.Identifier(owner), sql.Identifier(daemon)
            )
        )
    reader = new_role("reader", f"IN ROLE {roles.READER}")
    with db.connection(owner_url) as conn:
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON reviews TO {}").format(
                sql.Identifier(writer)
            )
        )
        conn.execute(sql.SQL("GRANT SELECT ON reviews TO {}").format(sql.Identifier(reader)))

    # The application writer: its own table only; pgembed's queues stay out of its reach.
    with db.connection(as_role(empty_db_url, writer)) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reviews VALUES (%s, %s, 3)", [*REVIEWS, LONG_REVIEW])
        conn.execute("UPDATE reviews SET body = body || '!' WHERE id = 1")
        conn.execute("UPDATE reviews SET id = 20 WHERE id = 2")
        conn.execute("DELETE FROM reviews WHERE id = 3")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgembed.inbox")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM pgembed.queue")
    # Even with the reader's USAGE on schema pgembed, its own trigger may not call pgembed's
    # capture functions (they run as their owner).
    with db.connection(owner_url) as conn:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgembed TO {}").format(sql.Identifier(writer)))
    with db.connection(as_role(empty_db_url, writer)) as conn:
        conn.execute("CREATE TEMP TABLE mine (id integer)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "CREATE TRIGGER t AFTER TRUNCATE ON mine "
                "EXECUTE FUNCTION pgembed.capture_truncate_v1('minilm')"
            )

    # The daemon: embeds everything the writer did, the long review's windows too.
    assert pgembed.sync_once(database_url=as_role(empty_db_url, daemon)).written == len(REVIEWS)
    with db.connection(owner_url) as conn:
        assert chunks(conn) > 0
    # The reader: searches and status; no writes to pgembed's tables.
    reader_url = as_role(empty_db_url, reader)
    with pgembed.Client(reader_url) as client:
        hits = client.search("minilm", "battery life", k=2)
    assert [hit.key for hit in hits][:1] == [1]
    with db.connection(reader_url) as conn:
        for statement in ("SELECT * FROM pgembed.queue", "DELETE FROM pgembed.queue"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    # status: the daemon's role (the queues hold every table's keys).
    assert pgembed.status(database_url=as_role(empty_db_url, daemon))[0]["queued"] == 0
    # alter-table: a member of the owner that inherits its privileges may change the key's type
    # (the chunk table's too, as schema pgembed's owner); the writer may not, and says so.
    statement = "ALTER TABLE reviews ALTER COLUMN id TYPE bigint"
    result = cli(
        "--database-url", as_role(empty_db_url, writer), "alter-table", "reviews", statement
    )
    assert result.exit_code != 0, result.output
    assert result.output.strip().splitlines() == [
        "pgembed: error: database error: permission denied for table migrations (the README's "
        '"Roles" says which role runs each command and what it needs)'
    ]
    deployer = new_role("deployer", f"IN ROLE {owner}")
    with db.connection(owner_url) as conn:
        kept = conn.execute("SELECT key, chunk, embedding FROM pgembed_minilm_chunks ORDER BY 1, 2")
        before = kept.fetchall()
    assert before
    deploy_url = as_role(empty_db_url, deployer)
    result = cli("--database-url", deploy_url, "alter-table", "reviews", statement)
    assert result.exit_code == 0, result.output
    with db.connection(owner_url) as conn:
        assert registry.get(conn, "minilm").key_type == "bigint"
        kept = conn.execute("SELECT key, chunk, embedding FROM pgembed_minilm_chunks ORDER BY 1, 2")
        assert kept.fetchall() == before
    with db.connection(as_role(empty_db_url, writer)) as conn:
        conn.execute("INSERT INTO reviews VALUES (5000000000, %s, 4)", (LONG_REVIEW[1],))
    assert pgembed.sync_once(database_url=as_role(empty_db_url, daemon)).written == 1
    with pgembed.Client(reader_url) as client:
        hits = client.search("minilm", "a long review on its battery", k=10)
    assert {100, 5000000000} <= {hit.key for hit in hits}
    # The writer's DELETE takes the chunks along (the capture function runs as the owner).
    with db.connection(as_role(empty_db_url, writer)) as conn:
        conn.execute("DELETE FROM reviews WHERE id IN (%s, 5000000000)", (LONG_REVIEW[0],))
    with db.connection(owner_url) as conn:
        assert chunks(conn) == 0
    # A model removed: the daemon keeps no privilege on its table.
    with db.connection(owner_url) as conn:
        models.remove(conn, "minilm")
        acl = conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'reviews'::regclass "
            "AND attacl::text LIKE '%%pgembed_daemon%%'"
        ).fetchone()
        gone = conn.execute("SELECT to_regclass('pgembed_minilm_chunks')").fetchone()
    assert acl == (0,) and gone == (None,)


def chunks(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pgembed_minilm_chunks").fetchone()
    assert row is not None
    return int(row[0])


def test_migrate_refuses_a_schema_that_shadows_built_ins(
    server_url: str, make_role: Callable[..., str]
) -> None:
    mallory = make_role("mallory")
    with database(server_url, "hostile") as url:
        with db.connection(url) as conn:
            conn.execute("CREATE EXTENSION vector")
            conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
                sql.Identifier(mallory)))  # fmt: skip
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(mallory)))
            # 0002 compares int[] with int[]: this would run as whoever migrates.
            conn.execute(
                "CREATE FUNCTION public.trap_lt(int[], int[]) RETURNS boolean LANGUAGE sql "
                "AS 'SELECT true'; "
                "CREATE OPERATOR public.< (LEFTARG = int[], RIGHTARG = int[], "
                "FUNCTION = public.trap_lt)"
            )
            conn.execute("RESET ROLE")
        result = cli("--database-url", url, "migrate")
        assert result.exit_code != 0
        (line,) = result.output.strip().splitlines()
        assert (
            "refusing to migrate: schema public (pgvector's) holds operator public.<(integer[]"
            in line
        )
        assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC" in line
        with db.connection(url) as conn:
            assert conn.execute("SELECT to_regclass('pgembed.models')").fetchone() == (None,)
            with conn.cursor() as cur:
                cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(mallory)))


def test_a_table_planted_where_chunks_were_is_never_used(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A chunk table dropped by hand leaves its name free: a table another role puts there (with
    a trigger that would make it superuser) is never written, read or dropped by pgembed."""
    mallory = make_role("mallory")
    with db.connection(db_url) as conn:
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(mallory)))
        conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
        conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO PUBLIC")
        request = models.AddRequest("whole", "docs", "body", precision="fp32", long_texts="chunk")
        models.add(conn, request)
        conn.execute("INSERT INTO docs VALUES (1, %s), (2, 'short')", (LONG_REVIEW[1],))
    assert pgembed.sync_once(database_url=db_url).written == 2
    with db.connection(db_url) as conn:
        conn.execute("DROP TABLE pgembed_whole_chunks")  # by mistake
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(mallory)))
        conn.execute(
            "CREATE TABLE public.pgembed_whole_chunks (key integer, chunk integer); "
            "CREATE FUNCTION public.evil() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$BEGIN EXECUTE 'ALTER ROLE {mallory} SUPERUSER'; RETURN NULL; END$$; "
            "CREATE TRIGGER evil BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE "
            "ON public.pgembed_whole_chunks FOR EACH STATEMENT EXECUTE FUNCTION public.evil()"
        )
        warnings: list[str] = []
        conn.add_notice_handler(lambda diag: warnings.append(diag.message_primary or ""))
        conn.execute("UPDATE docs SET body = body || ' Again.' WHERE id = 1")
        conn.execute("DELETE FROM docs WHERE id = 2")
        conn.execute("RESET ROLE")
        assert any("is gone or not pgembed's" in w for w in warnings), warnings
        # The daemon skips the model, status says why, a search says what to do.
        assert pgembed.sync_once(database_url=db_url).written == 0
        (report,) = pgembed.status(database_url=db_url)
        assert "is taken by an object that is not pgembed's" in report["broken"]
        assert "rename or drop it, then `pgembed reindex whole`" in report["broken"]
        # A reindex refuses at once, not after embedding every row for a switch that would fail.
        result = cli("--database-url", db_url, "reindex", "whole")
        assert result.exit_code == 2 and "rename or drop it" in result.output, result.output
        assert registry.shadow(conn, "whole") is None
        vector = np.zeros(384, dtype=np.float32)
        vector[0] = 1
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="reindex whole"):
            conn.execute("SELECT * FROM pgembed.search('whole', %s, 3)", (Vector(vector),))
        conn.rollback()
        models.remove(conn, "whole")  # leaves mallory's table alone
        assert conn.execute("SELECT to_regclass('public.pgembed_whole_chunks')").fetchone() != (
            None,
        )
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (mallory,))
        assert row.fetchone() == (False,)


def test_a_table_in_a_schema_the_daemon_may_not_use_is_skipped_and_said(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A watched table in a schema of its own: the daemon must look it up there. `model add`
    and `migrate` grant pgembed_daemon USAGE on it when their role may; without it the daemon
    skips that model with one line, which `status` gives too. Before, `permission denied for
    schema` stopped the sync of every model, and `status`."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = make_role("owner")
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        conn.execute(
            sql.SQL("GRANT {} TO {} WITH INHERIT FALSE").format(
                sql.Identifier(owner), sql.Identifier(daemon)
            )
        )
        for schema in ("kept", "public"):
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(
                    sql.Identifier(schema), sql.Identifier(owner)
                )
            )
            table = sql.Identifier(schema, "docs")
            conn.execute(
                sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, body text)").format(table)
            )
            conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table, sql.Identifier(owner)))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, 'review ' || g FROM generate_series(1, 3) g"
                ).format(table)
            )
            name = f"m_{schema}"
            models.add(conn, models.AddRequest(name, f"{schema}.docs", "body", precision="fp32"))
    _skipped_until_migrate(db_url, daemon, "kept", "kept.docs", ("m_public", "m_kept"), rows=3)


def test_a_key_type_in_a_schema_the_daemon_may_not_use_is_skipped_and_said(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A key of an extension's type installed in a schema of its own (citext in ext): keys are
    cast to that type, named there. `model add` and `migrate` grant pgembed_daemon USAGE on it
    when their role may; without it the daemon skips that model with one line and syncs the
    others. Before, one such model made every read of the catalog by that role fail."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        conn.execute("CREATE SCHEMA ext")
        conn.execute("CREATE EXTENSION citext SCHEMA ext")
        conn.execute("CREATE TABLE plain (id integer PRIMARY KEY, body text)")
        conn.execute("CREATE TABLE mails (email ext.citext PRIMARY KEY, body text)")
        conn.execute("INSERT INTO plain VALUES (1, 'a review'), (2, 'another review')")
        conn.execute("INSERT INTO mails VALUES ('A@x', 'one review'), ('b@X', 'two reviews')")
        for name, table in (("plainm", "plain"), ("mailm", "mails")):
            models.add(conn, models.AddRequest(name, table, "body", precision="fp32"))
    holds = "the type of public.mails's key column email"
    _skipped_until_migrate(db_url, daemon, "ext", holds, ("plainm", "mailm"), rows=2)


def _skipped_until_migrate(
    db_url: str, daemon: str, schema: str, holds: str, pair: tuple[str, str], *, rows: int
) -> None:
    """`model add` granted pgembed_daemon USAGE on `schema`, which `holds` the second model's
    table or key type, and queued each model's `rows` rows; without the grant (as when its role
    could not give it) the daemon writes the first model's rows and skips the second, its keys
    queued and status saying why; after `migrate` grants it again, the daemon writes those too."""
    synced, skipped = pair
    with db.connection(db_url) as conn:
        usable = "SELECT has_schema_privilege('pgembed_daemon', %s, 'USAGE')"
        assert conn.execute(usable, (schema,)).fetchone() == (True,)
        revoke = sql.SQL("REVOKE USAGE ON SCHEMA {} FROM pgembed_daemon")
        conn.execute(revoke.format(sql.Identifier(schema)))
        queued = dict(
            conn.execute("SELECT model, count(*) FROM pgembed.queue GROUP BY model").fetchall()
        )
    assert queued == {synced: rows, skipped: rows}
    daemon_url = as_role(db_url, daemon)
    assert worker.Worker(daemon_url, worker.Options(once=True)).run().written == rows
    report = {m["name"]: m for m in pgembed.status(database_url=daemon_url)}
    assert report[synced]["broken"] is None
    assert report[skipped]["queued"] == rows
    assert report[skipped]["broken"] == (
        f"role {daemon} may not use schema {schema}, which holds {holds}: its keys stay queued "
        f'(GRANT USAGE ON SCHEMA "{schema}" TO pgembed_daemon, run by the schema\'s owner; '
        "`model add` and `migrate` do it when their role may)"
    )
    with db.connection(db_url) as conn:
        migrate.migrate(conn)
    assert worker.Worker(daemon_url, worker.Options(once=True)).run().written == rows
