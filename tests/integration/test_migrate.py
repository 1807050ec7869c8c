from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from helpers import cli
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
