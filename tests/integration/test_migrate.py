from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from psycopg import sql
from roles_helpers import as_role, role_maker

from helpers import cli, database, database_name
from pgembed import db, migrate
from pgembed.errors import SchemaError


def test_migrate_applies_then_is_a_noop(empty_db_url: str) -> None:
    first = cli("--database-url", empty_db_url, "migrate")
    assert first.exit_code == 0, first.output
    assert "applied 0001_schema.sql" in first.output
    second = cli("--database-url", empty_db_url, "migrate")
    assert second.exit_code == 0
    assert "up to date" in second.output
    with db.connection(empty_db_url) as conn:
        rows = conn.execute(
            "SELECT version, name, sha256 FROM pgembed.migrations ORDER BY version"
        ).fetchall()
        assert rows == [(m.version, m.name, m.sha256) for m in migrate.available()]
        assert rows[0][:2] == (1, "schema")
        assert conn.execute(
            "SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
        ).fetchone() == (1,)


def test_tampered_migration_is_refused(empty_db_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, copy)
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn, copy)
        first = copy / "0001_schema.sql"
        first.write_text(first.read_text() + "\n-- an edit after the fact\n")
        with pytest.raises(SchemaError, match="changed after it was applied"):
            migrate.migrate(conn, copy)
        with pytest.raises(SchemaError, match="changed after it was applied"):
            migrate.require_current(conn, copy)


def test_new_migration_is_applied_and_required(empty_db_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, copy)
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn, copy)
        (copy / "9999_extra.sql").write_text("CREATE TABLE pgembed.extra (id int);")
        with pytest.raises(SchemaError, match=r"behind .* run `pgembed migrate`"):
            migrate.require_current(conn, copy)
        assert [m.filename for m in migrate.migrate(conn, copy)] == ["9999_extra.sql"]
        migrate.require_current(conn, copy)


def test_commands_ask_for_migrate_when_schema_missing(empty_db_url: str) -> None:
    result = cli("--database-url", empty_db_url, "status")
    assert result.exit_code == 1
    assert "run `pgembed migrate`" in result.output


def test_concurrent_migrate_runs_are_safe(empty_db_url: str) -> None:
    errors: list[BaseException] = []
    applied: list[int] = []

    def run() -> None:
        try:
            with db.connection(empty_db_url) as conn:
                applied.append(len(migrate.migrate(conn)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(applied) == [0, 0, 0, len(migrate.available())]


def test_failed_migration_leaves_nothing_behind(empty_db_url: str, tmp_path: Path) -> None:
    copy = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, copy)
    (copy / "0002_broken.sql").write_text("CREATE TABLE pgembed.half (id int); SELECT 1/0;")
    with db.connection(empty_db_url) as conn:
        with pytest.raises(Exception, match="division by zero"):
            migrate.migrate(conn, copy)
        assert migrate.applied(conn).keys() == {1}
        assert conn.execute("SELECT to_regclass('pgembed.half')").fetchone() == (None,)


def test_server_without_vector_gets_clear_error(empty_db_url: str) -> None:
    # Hide the extension from this one connection: no control file is found (PostgreSQL 18).
    with db.connection(empty_db_url) as conn:
        conn.execute("SET extension_control_path = '/nonexistent'")
        with pytest.raises(Exception, match="no `vector` extension available"):
            migrate.migrate(conn)


def test_a_role_that_may_not_create_vector_is_told_who_must(server_url: str) -> None:
    """pgvector is no trusted extension: a database owner that is no superuser cannot create it.
    migrate says in one line who must run what, where, and what managed services call it; then
    of a pgvector whose schema (not on the search_path) this role may not use, the GRANT."""
    with role_maker(server_url) as make_role, database(server_url, "e") as url:
        deployer = make_role("deployer", "CREATEDB")  # no superuser
        name = database_name(url)
        with db.connection(url) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
            ).fetchone() == (0,)  # not in the template either
            conn.execute(
                sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                    sql.Identifier(name), sql.Identifier(deployer)
                )
            )
        as_deployer = as_role(url, deployer)

        refused = cli("--database-url", as_deployer, "migrate")
        assert refused.exit_code == 1, refused.output
        assert refused.output.strip().splitlines() == [
            f"pgembed: error: the vector extension is not installed in database {name}, and role "
            f"{deployer} may not create it (pgvector needs a superuser): have a superuser run "
            f"`CREATE EXTENSION vector;` in database {name} (on Amazon RDS or Cloud SQL the admin "
            "role may; Azure Database for PostgreSQL first needs vector in its azure.extensions "
            "server parameter; Supabase: enable vector under Database, Extensions; Neon: run it "
            "in the SQL Editor), then run `pgembed migrate` again"
        ]
        with db.connection(url) as conn:
            assert conn.execute("SELECT to_regnamespace('pgembed')").fetchone() == (None,)
            # A superuser puts it in a schema of its own, off the search_path, without USAGE
            conn.execute("CREATE SCHEMA vectors")
            conn.execute("CREATE EXTENSION vector SCHEMA vectors")
        unusable = cli("--database-url", as_deployer, "migrate")
        assert unusable.exit_code == 1, unusable.output
        assert unusable.output.strip().splitlines() == [
            f"pgembed: error: pgvector is installed in schema vectors, which role {deployer} may "
            f"not use: have its owner run `GRANT USAGE ON SCHEMA vectors TO {deployer};`, then "
            "run `pgembed migrate` again"
        ]
        with db.connection(url) as conn:
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA vectors TO {}").format(sql.Identifier(deployer))
            )
        done = cli("--database-url", as_deployer, "migrate")  # off the search_path: found
        assert done.exit_code == 0, done.output
        assert "applied 0001_schema.sql" in done.output


# A model as pgembed 0.1 (migrations 0001-0006) made it: its catalog row and its four triggers.
_OLD_MODEL = """
CREATE TABLE public.docs (id integer PRIMARY KEY, body text);
INSERT INTO docs VALUES (1, 'a good phone'), (2, 'a bad charger');
ALTER TABLE docs ADD COLUMN embedding_m public.vector(384);
INSERT INTO pgembed.models (name, table_schema, table_name, key_column, key_type, text_column,
    embedding_column, model_ref, pooling, normalize, dimensions, max_seq_length)
VALUES ('m', 'public', 'docs', 'id', 'integer', 'body', 'embedding_m',
        'sentence-transformers/all-MiniLM-L6-v2', 'mean', true, 384, 256);
CREATE TRIGGER pgembed_m_ins AFTER INSERT ON docs REFERENCING NEW TABLE AS pgembed_new
    FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_insert_v1('m', 'id', 'body');
CREATE TRIGGER pgembed_m_upd BEFORE UPDATE OF body ON docs FOR EACH ROW
    WHEN (OLD.body IS DISTINCT FROM NEW.body)
    EXECUTE FUNCTION pgembed.capture_update_v1('m', 'id', 'body', 'embedding_m');
CREATE TRIGGER pgembed_m_del AFTER DELETE ON docs REFERENCING OLD TABLE AS pgembed_old
    FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_delete_v1('m', 'id', 'body');
CREATE TRIGGER pgembed_m_trunc AFTER TRUNCATE ON docs
    FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_truncate_v1('m', 'id', 'body');
INSERT INTO pgembed.queue (model, key) VALUES ('m', '1'), ('m', '2');
"""


def test_a_model_made_before_0007_is_upgraded(empty_db_url: str, tmp_path: Path) -> None:
    old = tmp_path / "migrations"
    old.mkdir()
    for migration in migrate.available()[:6]:
        shutil.copy(migrate.MIGRATIONS_DIR / migration.filename, old)
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn, old)
        conn.execute(_OLD_MODEL.encode())
        applied = migrate.migrate(conn)
        assert [m.version for m in applied] == [m.version for m in migrate.available()[6:]]
        triggers = conn.execute(
            "SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'docs'::regclass ORDER BY 1"
        ).fetchall()
        assert triggers == [(f"pgembed_m_{e}", "A") for e in ("del", "ins", "trunc", "upd")]
        row = conn.execute("SELECT text_columns FROM pgembed.models").fetchone()
        assert row == (["body"],)
        conn.execute("DELETE FROM pgembed.queue")
        conn.execute("UPDATE docs SET id = 20 WHERE id = 2")  # a key change: fires now
        conn.execute("INSERT INTO docs VALUES (3, 'one more')")
        keys = conn.execute("SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox")
        assert sorted(k for (k,) in keys) == ["20", "3"]
