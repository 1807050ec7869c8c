"""A database made by release 0012 (migrations 0001-0012, whose files still carry the function
bodies) upgrades to the one-definition layout (migration 0013, then sql/definitions/) with its
models, vectors, chunks, queued work, triggers and grants intact, and works on after it."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgembed import db, migrate, sqlfiles
from pgembed.errors import SchemaError
from pgembed.lifecycle import models
from pgembed.sync import worker
from schema_helpers import describe

LONG_REVIEWS = Path(__file__).parent.parent / "data" / "imdb-long-reviews.csv"

# The grants release 0012's `migrate --create-roles` made (its pgembed/sql/roles.sql; the roles
# themselves are made as they still are, by roles.sql's `create`).
_GRANTS_0012 = """
GRANT USAGE ON SCHEMA pgembed TO pgembed_daemon;
GRANT SELECT ON pgembed.migrations, pgembed.models, pgembed.model_versions TO pgembed_daemon;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgembed.queue, pgembed.inbox, pgembed.failures,
    pgembed.truncated, pgembed.workers, pgembed.batches TO pgembed_daemon;
GRANT UPDATE (status) ON pgembed.models TO pgembed_daemon;
GRANT USAGE ON SCHEMA pgembed TO pgembed_reader;
GRANT SELECT ON pgembed.migrations, pgembed.models, pgembed.model_versions TO pgembed_reader;
"""

# What must come through the upgrade unchanged, each as rows in a stable order.
_STATE = {
    # Every column 0012 had (0018's two walks come NULL: no model is tuned for them).
    "models": "SELECT to_jsonb(m) - '{first_walk_ef_search,second_walk_ef_search,"
    "second_walk_mean_distance}'::text[] FROM pgembed.models m ORDER BY m.name",
    "versions": "SELECT * FROM pgembed.model_versions ORDER BY 1, 2",
    "vectors": "SELECT id, embedding_minilm::text, embedding_chunky::text FROM reviews ORDER BY id",
    "chunks": "SELECT key, chunk, embedding::text FROM pgembed_chunky_chunks ORDER BY 1, 2",
    "queue": "SELECT model, key, seq, attempts FROM pgembed.queue ORDER BY 1, 2",
    "inbox": "SELECT model, key, seq FROM pgembed.inbox ORDER BY 1, 2, 3",
    "triggers": "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
    "WHERE tgrelid = 'reviews'::regclass ORDER BY 1",
    "grants": "SELECT grantee, table_schema, table_name, privilege_type "
    "FROM information_schema.role_table_grants "
    "WHERE grantee IN ('pgembed_daemon', 'pgembed_reader') ORDER BY 1, 2, 3, 4",
    "column grants": "SELECT grantee, table_name, column_name, privilege_type "
    "FROM information_schema.column_privileges "
    "WHERE grantee IN ('pgembed_daemon', 'pgembed_reader') ORDER BY 1, 2, 3, 4",
}


def _state(conn: psycopg.Connection) -> dict[str, list[Any]]:
    return {name: conn.execute(query.encode()).fetchall() for name, query in _STATE.items()}


def _release_0012(tmp_path: Path) -> Path:
    old = tmp_path / "migrations-0012"
    old.mkdir()
    for migration in migrate.available():
        if migration.version <= 12:
            shutil.copy(migrate.MIGRATIONS_DIR / migration.filename, old)
    return old


def _long_reviews(count: int) -> list[tuple[int, str]]:
    with LONG_REVIEWS.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))[:count]
    return [(int(row["id"]), row["text"]) for row in rows]


def _sync(url: str) -> None:
    """Drain every queue as a worker does, without its schema check (the 0012 database is
    behind this pgembed on purpose)."""
    daemon = worker.Worker(url, worker.Options(once=True))
    with db.connection(url) as conn:
        daemon.drain(conn, daemon.models(conn))


@pytest.fixture
def database_0012(empty_db_url: str, tmp_path: Path) -> str:
    """A 0012 database with two models (one chunked), vectors, chunks, queued work and roles."""
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn, _release_0012(tmp_path))
        assert conn.execute("SELECT to_regclass('pgembed.definitions')").fetchone() == (None,)
        conn.execute(sqlfiles.get("roles", "create"))
        conn.execute(_GRANTS_0012.encode())
        # Release 0012 compared keys by the catalog's key_type in pg_catalog's schema: this
        # pgembed does so when pgembed._key_v1 and _key_schema_v1 (definitions since) tell
        # nothing. The upgrade replaces these stand-ins.
        conn.execute(
            "CREATE FUNCTION pgembed._key_v1(text, text, text, OUT cast_to text, "
            "OUT equals text, OUT greater text) LANGUAGE sql AS 'SELECT NULL, NULL, NULL'"
        )
        conn.execute(
            "CREATE FUNCTION pgembed._key_schema_v1(text, text, text) RETURNS name "
            "LANGUAGE sql AS 'SELECT NULL::name'"
        )
        conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text NOT NULL)")
        reviews = _long_reviews(12)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reviews VALUES (%s, %s)", reviews[:8])
        for name, long_texts in (("minilm", "truncate"), ("chunky", "chunk")):
            request = models.AddRequest(
                name, "reviews", "body", precision="fp32", long_texts=long_texts
            )
            models.add(conn, request)
        _sync(empty_db_url)
        # Work left queued across the upgrade: new rows and a changed one.
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reviews VALUES (%s, %s)", reviews[8:])
        conn.execute(
            "UPDATE reviews SET body = body || ' (edited)' WHERE id = %s", (reviews[0][0],)
        )
    return empty_db_url


def test_a_0012_database_upgrades_intact(database_0012: str, other_empty_db_url: str) -> None:
    with db.connection(database_0012) as conn:
        before = _state(conn)
        assert before["chunks"], "the chunked model has windows past the first"
        queued = {(model, key) for model, key, *_ in before["queue"] + before["inbox"]}
        assert len(queued) == 2 * 5, "4 new rows and 1 changed one, for each model"
        defined: list[migrate.Definition] = []
        applied = migrate.migrate(conn, on_define=defined.append)
        newer = [m.filename for m in migrate.available() if m.version > 12]
        assert [m.filename for m in applied] == newer  # 0013_definitions.sql and later ones
        assert [d.file for d in defined] == [d.file for d in migrate.definitions()]
        after = _state(conn)
        # Every grant stays; the only new ones are on the new record, for both roles, and the
        # SELECT on pgembed.models reaching its new columns (0018's two walks).
        new_columns = {"first_walk_ef_search", "second_walk_ef_search", "second_walk_mean_distance"}
        for kind, table in (("grants", 2), ("column grants", 1)):
            new = [row for row in after[kind] if row not in before[kind]]
            assert {row[table] for row in new if row[2] not in new_columns} == {"definitions"}
            assert {(row[1], row[3]) for row in new if row[2] in new_columns} <= {
                ("models", "SELECT")
            }, kind
            after[kind] = [row for row in after[kind] if row not in new]
        assert after == before
        untuned = "SELECT count(*) FROM pgembed.models WHERE first_walk_ef_search IS NULL"
        assert conn.execute(untuned).fetchone() == (2,)
        migrate.require_current(conn)
        upgraded = describe(conn)
        # The daemon and readers may read the new record (roles.grant at every migrate).
        for role in ("pgembed_daemon", "pgembed_reader"):
            assert conn.execute(
                "SELECT has_table_privilege(%s, 'pgembed.definitions', 'SELECT')", (role,)
            ).fetchone() == (True,)
        # Searches work on the vectors made before the upgrade, chunked model included.
        probe = conn.execute(
            "SELECT embedding_minilm, embedding_chunky FROM reviews WHERE id = %s",
            (before["vectors"][1][0],),
        ).fetchone()
        assert probe is not None
        for model, vector in zip(("minilm", "chunky"), probe, strict=True):
            hits = conn.execute(
                "SELECT key FROM pgembed.search(%s, %s, 3)", (model, vector)
            ).fetchall()
            assert hits[0] == (str(before["vectors"][1][0]),)
        # The work queued before the upgrade is done after it.
        _sync(database_0012)
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
        missing = conn.execute(
            "SELECT count(*) FROM reviews WHERE embedding_minilm IS NULL "
            "OR embedding_chunky IS NULL"
        ).fetchone()
        assert missing == (0,)
        # A second migrate has nothing to do.
        again: list[migrate.Definition] = []
        assert migrate.migrate(conn, on_define=again.append) == [] and again == []
    # pgembed's own objects are those of a new install (pgembed.search is generated per model).
    with db.connection(other_empty_db_url) as conn:
        migrate.migrate(conn)
        fresh = describe(conn)
    search = "function pgembed.search(model text, query vector, k integer, filter jsonb)"
    assert {k: v for k, v in upgraded.items() if k != search} == {
        k: v for k, v in fresh.items() if k != search
    }


def test_changed_definitions_are_applied_again_and_required(db_url: str, tmp_path: Path) -> None:
    """A release that changes only a function: `require_current` asks for `pgembed migrate`,
    which applies the definitions (and nothing else) once."""
    changed = tmp_path / "definitions"
    shutil.copytree(migrate.DEFINITIONS_DIR, changed)
    capture = changed / "20_capture.sql"
    capture.write_text(
        capture.read_text(encoding="utf-8")
        + "\nCOMMENT ON FUNCTION pgembed._has_text_v1(text) IS 'a new release';\n",
        encoding="utf-8",
    )
    with db.connection(db_url) as conn:
        migrate.require_current(conn)
        with pytest.raises(Exception, match=r"20_capture.sql changed\): run `pgembed migrate`"):
            migrate.require_current(conn, definitions_dir=changed)
        defined: list[migrate.Definition] = []
        assert migrate.migrate(conn, definitions_dir=changed, on_define=defined.append) == []
        assert len(defined) == len(migrate.definitions())
        migrate.require_current(conn, definitions_dir=changed)
        comment = conn.execute(
            "SELECT obj_description('pgembed._has_text_v1(text)'::regprocedure, 'pg_proc')"
        ).fetchone()
        assert comment == ("a new release",)
        defined.clear()
        migrate.migrate(conn, definitions_dir=changed, on_define=defined.append)
        assert defined == []


def test_an_older_pgembed_leaves_newer_definitions_alone(db_url: str) -> None:
    """A database a newer pgembed migrated (a migration this one lacks): this one still
    searches and syncs there, as before the definitions, but refuses to migrate it back."""
    with db.connection(db_url) as conn:
        conn.execute(
            "INSERT INTO pgembed.migrations (version, name, sha256) VALUES (9999, 'later', 'x')"
        )
        conn.execute("UPDATE pgembed.definitions SET sha256 = 'a newer one'")
        migrate.require_current(conn)
        with pytest.raises(SchemaError, match=r"newer pgembed \(migration 9999"):
            migrate.migrate(conn)
        assert conn.execute("SELECT DISTINCT sha256 FROM pgembed.definitions").fetchall() == [
            ("a newer one",)
        ]
