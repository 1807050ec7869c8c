"""The README's "Your own PostgreSQL", run as written against a server run the way managed
services run one: TCP with SCRAM passwords, an admin role with CREATEROLE and CREATEDB that is
not a superuser and owns the database, pgvector created for it. Nobody is superuser after that:
the admin migrates, makes the table, adds the model and the daemon's and the reader's logins;
the daemon syncs and the reader searches as those least-privilege logins. Both owner layouts:
the admin owns the table, or an owner role the admin made."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from clusters import pg, server_dir, start

from helpers import run_cli_here, with_database
from pgembed.embedded import access

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"ADMIN_PASSWORD": "admin-s3cret", "WORKER_PASSWORD": "w0rker", "READER_PASSWORD": "r"}


def recipe() -> list[str]:
    """The ```sh blocks under the README's "Your own PostgreSQL": setup, owner role, run."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Your own PostgreSQL") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 3, blocks
    return blocks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def managed() -> Iterator[str]:
    """A cluster on 127.0.0.1 with password logins only, its admin role and database `app` with
    pgvector: the host:port for $DB_HOST."""
    pgdata, port = server_dir(), free_port()
    try:
        pg("initdb", "-D", str(pgdata), *access.INITDB_OPTIONS)
        access.write_auth_files(pgdata)  # the superuser over the socket, for this setup only
        with (pgdata / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 127.0.0.1/32 scram-sha-256\n")
        superuser = start(pgdata, f"-c listen_addresses=127.0.0.1 -p {port}")
        superuser = f"{superuser}&port={port}"
        with psycopg.connect(superuser, autocommit=True) as conn:
            conn.execute(
                "CREATE ROLE admin LOGIN CREATEROLE CREATEDB PASSWORD "
                f"'{PASSWORDS['ADMIN_PASSWORD']}'"
            )
            conn.execute("CREATE DATABASE app OWNER admin")
        with psycopg.connect(with_database(superuser, "app"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")  # what the service's console does
        yield f"127.0.0.1:{port}"
    finally:
        if (pgdata / "postmaster.pid").exists():
            pg("pg_ctl", "-D", str(pgdata), "-m", "immediate", "stop")
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.mark.parametrize("layout", ["the admin owns the table", "an owner role owns it"])
def test_the_recipe_runs_with_no_superuser(managed: str, layout: str, tmp_path: Path) -> None:
    setup, owner, run = recipe()
    blocks = [setup, owner, run] if layout == "an owner role owns it" else [setup, run]
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env.update(PASSWORDS, DB_HOST=managed, PGEMBED_HOME=str(tmp_path / "home"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's pgembed
    script = "set -euo pipefail\n" + "\n".join(blocks)
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "synced: 2 written, 0 skipped, 0 failed" in done.stdout, done.stdout
    hits = [line.split("\t") for line in done.stdout.splitlines() if re.match(r"^\d+\t", line)]
    assert [hit[0] for hit in hits] == ["1"], done.stdout
    assert not (tmp_path / "home").exists()  # no embedded server was started on the way
    admin = f"postgresql://admin:{PASSWORDS['ADMIN_PASSWORD']}@{managed}/app"
    with psycopg.connect(admin) as conn:
        supers = conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper").fetchall()
        owner_of = conn.execute("SELECT relowner::regrole::text FROM pg_class "
                                "WHERE relname = 'reviews'").fetchone()  # fmt: skip
        workers = conn.execute(
            "SELECT r.rolsuper, r.rolbypassrls, pg_has_role('pgembed_worker', 'pgembed_daemon', "
            "'MEMBER') FROM pg_roles r WHERE r.rolname = 'pgembed_worker'"
        ).fetchone()
    assert supers == [("postgres",)]  # the cluster's own, used for the setup above only
    assert owner_of == (("app_owner",) if layout == "an owner role owns it" else ("admin",))
    assert workers == (False, False, True)


def test_bad_input_on_the_managed_server_is_one_line_saying_what_to_run(managed: str) -> None:
    """A wrong password, a role without CONNECT, a role that may not create pgembed's schema or
    does not own it: one line each, naming what to run and who runs it."""
    admin = f"postgresql://admin:{PASSWORDS['ADMIN_PASSWORD']}@{managed}/app"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE ROLE outsider LOGIN PASSWORD 'x'")
        conn.execute("REVOKE CONNECT ON DATABASE app FROM PUBLIC")
        conn.execute("CREATE ROLE helper LOGIN PASSWORD 'x'")
        conn.execute("GRANT CONNECT ON DATABASE app TO helper")

    def error(url: str) -> str:
        done = run_cli_here("--database-url", url, "migrate")
        assert done.returncode != 0 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("pgembed: error: ")
        return done.stderr

    assert "password authentication failed" in error(f"postgresql://admin:wrong@{managed}/app")
    assert "GRANT CONNECT ON DATABASE app TO outsider" in error(
        f"postgresql://outsider:x@{managed}/app"
    )
    helper = f"postgresql://helper:x@{managed}/app"
    assert "run `pgembed migrate` as admin, the owner of database app, or have it run GRANT " \
        "CREATE ON DATABASE app TO helper" in error(helper)  # fmt: skip
    assert run_cli_here("--database-url", admin, "migrate").returncode == 0
    assert "run `pgembed migrate` as admin, the owner of schema pgembed" in error(helper)
