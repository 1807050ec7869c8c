"""Trust, second round: nothing a watched table's owner defines (a trigger, a cast, a type) runs
with the privileges of the role that migrates or syncs. Each test plants the attack an audit
ran, as a non-superuser owner whose code tries to make itself SUPERUSER (or to read a table it
may not), and checks it stays powerless.

Roles are cluster-wide: each test makes its own (make_role) and drops them after.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from roles_helpers import as_role, role_maker, with_user

import pgembed
from helpers import cli, make_due, run_cli_here
from pgembed import db, roles
from pgembed.catalog import registry, trust
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.sync import worker


@pytest.fixture
def make_role(db_url: str) -> Iterator[Callable[..., str]]:
    with role_maker(db_url) as make:
        yield make


# Tries to make `owner` a superuser from whatever role runs it; records who ran it.
_PWN = """
CREATE TABLE public.ran (by_role text);
GRANT INSERT ON public.ran TO PUBLIC;
CREATE FUNCTION public.pwn() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ran VALUES (current_user);
    BEGIN
        EXECUTE format('ALTER ROLE %I SUPERUSER', '{owner}');
    EXCEPTION WHEN others THEN NULL;
    END;
    BEGIN  -- out of a SET ROLE the owner's code runs under, back to the session's role
        RESET ROLE;
        EXECUTE format('ALTER ROLE %I SUPERUSER', '{owner}');
    EXCEPTION WHEN others THEN NULL;
    END;
END $$;
"""


def superuser(conn: psycopg.Connection, role: str) -> bool:
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    return row == (True,)


def _owner_with_traps(conn: psycopg.Connection, make: Callable[..., str]) -> str:
    owner = make("owner")
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(owner)))
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
    conn.execute(_PWN.replace("{owner}", owner).encode())
    conn.execute("RESET ROLE")
    return owner


def test_a_key_type_of_the_owners_casts_nothing_as_the_migrating_role(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A composite key type with the owner's own cast to text: `model add` refuses it (today it
    accepted it, and one INSERT ran the cast inside the SECURITY DEFINER capture function)."""
    with db.connection(db_url) as conn:
        owner = _owner_with_traps(conn, make_role)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        conn.execute(
            "CREATE TYPE public.k AS (n integer); "
            "CREATE FUNCTION public.k_text(public.k) RETURNS text LANGUAGE plpgsql AS "
            "$$BEGIN PERFORM public.pwn(); RETURN ($1).n::text; END$$; "
            "CREATE CAST (public.k AS text) WITH FUNCTION public.k_text(public.k); "
            "CREATE TABLE public.docs (id public.k PRIMARY KEY, body text)"
        )
        conn.execute("RESET ROLE")
        refused = None
        try:  # as a superuser, as the audit did
            models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        except UsageError as exc:
            refused = str(exc)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        conn.execute("INSERT INTO public.docs VALUES (ROW(1), 'the battery dies')")
        conn.execute("RESET ROLE")
        assert not superuser(conn, owner)
        assert conn.execute("SELECT by_role FROM public.ran").fetchall() == []
    assert refused is not None and "key column 'id'" in refused and "non-superuser owns" in refused


def test_a_column_type_given_to_a_user_later_is_not_cast_by_capture(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A model added while a superuser owned the key type (or before `model add` checked): once
    a user owns the type and gives it a cast, the capture functions cast nothing of it, warn,
    and the daemon and status call the model broken."""
    with db.connection(db_url) as conn:
        owner = _owner_with_traps(conn, make_role)
        conn.execute("CREATE TYPE public.k AS (n integer)")
        conn.execute("CREATE TABLE public.docs (id public.k PRIMARY KEY, body text)")
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        conn.execute(sql.SQL("ALTER TYPE public.k OWNER TO {}").format(sql.Identifier(owner)))
        conn.execute(sql.SQL("ALTER TABLE public.docs OWNER TO {}").format(sql.Identifier(owner)))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        conn.execute(
            "CREATE FUNCTION public.k_text(public.k) RETURNS text LANGUAGE plpgsql AS "
            "$$BEGIN PERFORM public.pwn(); RETURN ($1).n::text; END$$; "
            "CREATE CAST (public.k AS text) WITH FUNCTION public.k_text(public.k)"
        )
        warnings: list[str] = []
        conn.add_notice_handler(lambda diag: warnings.append(diag.message_primary or ""))
        conn.execute("INSERT INTO public.docs VALUES (ROW(1), 'the battery dies')")
        conn.execute("UPDATE public.docs SET body = 'the battery lasts'")
        conn.execute("DELETE FROM public.docs")
        conn.execute("RESET ROLE")
        assert not superuser(conn, owner)
        assert conn.execute("SELECT by_role FROM public.ran").fetchall() == []
        assert any("non-superuser owns" in w for w in warnings), warnings
    (report,) = pgembed.status(database_url=db_url)
    assert "non-superuser owns" in report["broken"]


# The owner's trigger on its own table: tries to become SUPERUSER, to copy a table it may not
# read (public.secret, another model's) into its own, and to leave traps in the syncing session
# for the daemon's next statements: a search_path of its own and a temporary domain named
# `text` whose check would run as whoever casts to it.
_TRIGGER = """
CREATE TABLE public.loot (body text);
CREATE FUNCTION public.pwn_check(text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.pwn(); RETURN true; END $$;
CREATE FUNCTION public.on_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.pwn();
    BEGIN
        INSERT INTO public.loot SELECT body FROM public.secret;
    EXCEPTION WHEN others THEN NULL;
    END;
    BEGIN
        EXECUTE 'CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (public.pwn_check(VALUE))';
    EXCEPTION WHEN others THEN NULL;
    END;
    PERFORM pg_catalog.set_config('search_path', 'public', false);
    RETURN NEW;
END $$;
CREATE TRIGGER on_write BEFORE UPDATE ON public.docs FOR EACH ROW
EXECUTE FUNCTION public.on_write();
"""


def _owned_table(conn: psycopg.Connection, owner: str) -> None:
    """docs, owned by `owner` and watched; public.secret, watched by another model (so the
    daemon role may read its text) and denied to the owner."""
    conn.execute("CREATE TABLE public.secret (id integer PRIMARY KEY, body text)")
    conn.execute("INSERT INTO public.secret VALUES (1, 'the launch code is 0000')")
    models.add(conn, models.AddRequest("other", "secret", "body", precision="fp32"))
    conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
    conn.execute(sql.SQL("ALTER TABLE public.docs OWNER TO {}").format(sql.Identifier(owner)))
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
    conn.execute(_TRIGGER.encode())
    conn.execute(
        "INSERT INTO public.docs SELECT g, 'review ' || g || ': the battery dies' "
        "FROM generate_series(1, 7) g"
    )
    conn.execute("RESET ROLE")


def _sync(url: str) -> worker.Stats:
    """Batches of two keys: the daemon's statements after one owner write meet its traps."""
    return worker.Worker(url, worker.Options(once=True, claim_size=2)).run()


def _embedded(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(embedding_minilm) FROM public.docs").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("syncer", ["superuser", "daemon"])
def test_the_owners_trigger_runs_with_the_owners_rights_only(
    db_url: str, make_role: Callable[..., str], syncer: str
) -> None:
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = _owner_with_traps(conn, make_role)
        _owned_table(conn, owner)
        url = db_url
        if syncer == "daemon":  # a pgembed_daemon member that may act as the table's owner
            url = as_role(db_url, make_role("daemon", f"IN ROLE {roles.DAEMON}"))
            conn.execute(
                sql.SQL("GRANT {} TO {} WITH INHERIT FALSE").format(
                    sql.Identifier(owner), sql.Identifier(roles.DAEMON)
                )
            )
    stats = _sync(url)
    with db.connection(db_url) as conn:
        assert not superuser(conn, owner)
        assert conn.execute("SELECT count(*) FROM public.loot").fetchone() == (0,)
        ran = {by for (by,) in conn.execute("SELECT DISTINCT by_role FROM public.ran")}
        assert ran == {owner}, ran  # the trigger did run, as the owner and nobody else
        assert _embedded(conn) == 7 and stats.written == 8
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_a_daemon_that_may_not_act_as_the_owner_leaves_the_table_queued(
    db_url: str, make_role: Callable[..., str]
) -> None:
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = _owner_with_traps(conn, make_role)
        _owned_table(conn, owner)
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        daemon_url = as_role(db_url, daemon)
    stats = _sync(daemon_url)
    with db.connection(db_url) as conn:
        assert conn.execute("SELECT by_role FROM public.ran").fetchall() == []
        assert _embedded(conn) == 0 and stats.written == 1  # public.secret's row only
    report = {m["name"]: m for m in pgembed.status(database_url=daemon_url)}
    assert f"GRANT {owner} TO {daemon} WITH INHERIT FALSE" in report["minilm"]["broken"]
    assert report["minilm"]["queued"] == 7


@pytest.mark.parametrize("may", ["administers", "may SET ROLE to"])
def test_an_owner_that_may_act_as_the_daemon_is_written_directly(
    db_url: str, make_role: Callable[..., str], may: str
) -> None:
    """An owner that could become the daemon's login anyway (SET ROLE to it; or the ADMIN option
    on it, which PostgreSQL 16+ gives the role that created it, as a managed service's admin
    creates the daemon's login) gains nothing from its code running as the daemon: its table is
    written directly, with no membership in the owner asked of the daemon. Not so for a session
    that logged in as a superuser and SET ROLE to that login: the owner's code could RESET ROLE."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = make_role("owner")
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(daemon)))
        option = "ADMIN OPTION, INHERIT FALSE, SET FALSE" if may == "administers" else "SET TRUE"
        conn.execute(
            sql.SQL("GRANT {} TO {} WITH {}").format(
                sql.Identifier(daemon), sql.Identifier(owner), sql.SQL(option)
            )
        )
        conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
        conn.execute(sql.SQL("ALTER TABLE public.docs OWNER TO {}").format(sql.Identifier(owner)))
        conn.execute("INSERT INTO public.docs SELECT g, 'doc ' || g FROM generate_series(1, 7) g")
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    with db.connection(as_role(db_url, daemon)) as conn:  # session user: the superuser
        found = trust.inspect(conn, registry.get(conn, "minilm"))
        assert found is not None and not found.owner_can_become_role and found.writes_as_owner
    daemon_url = with_user(db_url, daemon)  # its own login
    with db.connection(daemon_url) as conn:
        found = trust.inspect(conn, registry.get(conn, "minilm"))
        assert found is not None and not found.can_become_owner
        assert found.owner_can_become_role and not found.writes_as_owner
    stats = _sync(daemon_url)
    assert stats.written == 7 and stats.failed == 0
    with db.connection(db_url) as conn:
        assert _embedded(conn) == 7


def _syncers_docs(db_url: str, code: str) -> None:
    """public.docs, owned by the syncer (written directly) and watched, 7 rows queued; `code`
    run first."""
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        conn.execute(
            f"{code} INSERT INTO public.docs SELECT g, 'review ' || g FROM generate_series(1, 7) g"
        )


def _owners_docs(db_url: str, make_role: Callable[..., str], code: str) -> str:
    """public.docs, owned by a new owner (with its traps) and watched, 7 rows queued; `code` run
    as that owner first. The owner's name."""
    with db.connection(db_url) as conn:
        owner = _owner_with_traps(conn, make_role)
        conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
        conn.execute(sql.SQL("ALTER TABLE public.docs OWNER TO {}").format(sql.Identifier(owner)))
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
        conn.execute(
            f"{code} INSERT INTO public.docs SELECT g, 'review ' || g FROM generate_series(1, 7) g"
        )
        conn.execute("RESET ROLE")
    return owner


def _refused(db_url: str, owner: str, caplog: pytest.LogCaptureFixture, why: str) -> set[str]:
    """Sync as a superuser: nothing written (each key's write refused saying `why`), the owner
    powerless, the 7 keys queued for a retry, each with an attempt and `why` counted (not left
    leased). The roles the owner's code ran as."""
    with caplog.at_level(logging.WARNING, logger="pgembed.sync"):
        stats = _sync(db_url)
    assert f"as its owner {owner}" in caplog.text and why in caplog.text, caplog.text
    with db.connection(db_url) as conn:
        assert not superuser(conn, owner)
        ran = {by for (by,) in conn.execute("SELECT DISTINCT by_role FROM public.ran")}
        assert ran <= {owner}, ran
        assert _embedded(conn) == 0 and stats.written == 0 and stats.failed == 7
        queued = conn.execute("SELECT attempts, last_error, claimed_by FROM pgembed.queue")
        assert [(a, why in e, c) for a, e, c in queued] == [(1, True, None)] * 7
    (report,) = pgembed.status(database_url=db_url)
    assert report["queued"] == 7
    return ran


def test_a_trigger_the_owner_defers_to_the_commit_never_fires_as_the_syncer(
    db_url: str, make_role: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """The owner's code defers its constraint trigger while the daemon writes as the owner:
    at the commit it would run as the syncing role (a superuser here). The write is refused."""
    owner = _owners_docs(
        db_url,
        make_role,
        "CREATE FUNCTION public.later() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN PERFORM public.pwn(); RETURN NULL; END$$; "
        "CREATE CONSTRAINT TRIGGER later AFTER UPDATE ON public.docs "
        "DEFERRABLE INITIALLY IMMEDIATE FOR EACH ROW EXECUTE FUNCTION public.later(); "
        "CREATE FUNCTION public.defer() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN SET CONSTRAINTS ALL DEFERRED; RETURN NEW; END$$; "
        "CREATE TRIGGER defer BEFORE UPDATE ON public.docs FOR EACH ROW "
        "EXECUTE FUNCTION public.defer();",
    )
    _refused(db_url, owner, caplog, "changed public.docs whose deferrable triggers")


def test_a_cursor_the_owner_holds_past_the_commit_never_runs_as_the_syncer(
    db_url: str, make_role: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """The owner's trigger declares a cursor WITH HOLD while the daemon writes as the owner:
    at the commit PostgreSQL would run its query as the syncing role (a superuser here). The
    write is refused, and the rollback drops the cursor unrun."""
    owner = _owners_docs(
        db_url,
        make_role,
        "CREATE FUNCTION public.hold() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT public.pwn()'; "
        "RETURN NEW; END$$; "
        "CREATE TRIGGER hold BEFORE UPDATE ON public.docs FOR EACH ROW "
        "EXECUTE FUNCTION public.hold();",
    )
    assert _refused(db_url, owner, caplog, "left cursors WITH HOLD (held)") == set()


def test_a_write_as_the_owner_without_track_counts_is_refused(
    db_url: str, make_role: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """The deferrable-trigger check reads this transaction's counts of changed tables: with
    track_counts off (a superuser's setting) it saw none, and let any pass."""
    owner = _owners_docs(db_url, make_role, "")
    with db.connection(db_url) as conn:
        database = sql.Identifier(conn.info.dbname)
        conn.execute(sql.SQL("ALTER DATABASE {} SET track_counts = off").format(database))
    try:
        _refused(db_url, owner, caplog, "which needs track_counts on")
    finally:
        with db.connection(db_url) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET track_counts").format(database))


def test_a_daemon_without_temp_leaves_the_table_queued_and_says_why(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """The owner's writing function is made in the daemon's temp schema: without TEMPORARY on
    the database the daemon skips the model (its keys stay queued) and status names the grant."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = _owner_with_traps(conn, make_role)
        _owned_table(conn, owner)
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        conn.execute(
            sql.SQL("GRANT {} TO {} WITH INHERIT FALSE").format(
                sql.Identifier(owner), sql.Identifier(daemon)
            )
        )
        database = sql.Identifier(conn.info.dbname)
        conn.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(database))
        conn.execute(
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(database, sql.Identifier(owner))
        )
        daemon_url = as_role(db_url, daemon)
    _sync(daemon_url)
    with db.connection(db_url) as conn:
        assert _embedded(conn) == 0
    report = {m["name"]: m for m in pgembed.status(database_url=daemon_url)}
    assert f"GRANT TEMPORARY ON DATABASE ... TO {daemon}" in report["minilm"]["broken"]
    assert report["minilm"]["queued"] == 7


# The owner's trigger refuses a vector for rows 3 and 6, and lets the others through.
_REFUSE_SOME = (
    "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN IF NEW.id % 3 = 0 AND NEW.embedding_minilm IS NOT NULL THEN "
    "RAISE EXCEPTION 'row % may have no vector', NEW.id; END IF; RETURN NEW; END$$; "
    "CREATE TRIGGER refuse BEFORE UPDATE ON public.docs FOR EACH ROW "
    "EXECUTE FUNCTION public.refuse();"
)


@pytest.mark.parametrize("owned_by", ["another role", "the syncer"])
def test_rows_the_owners_trigger_refuses_fail_alone_then_move_to_failures(
    db_url: str, make_role: Callable[..., str], owned_by: str
) -> None:
    """A write the table's own code refuses is a failure like the model's: bisected down to the
    refused rows (the others written), counted in attempts with the trigger's message, moved to
    pgembed.failures after --max-attempts, said by `sync --once` and `status`; its keys never
    left leased as if their worker had died. As the owner (another role) and as the syncer."""
    if owned_by == "another role":
        _owners_docs(db_url, make_role, _REFUSE_SOME)
    else:
        _syncers_docs(db_url, _REFUSE_SOME)
    sync = ("--database-url", db_url, "sync", "--once", "--claim-size", "4", "--max-attempts", "2")
    first = run_cli_here(*sync)
    assert first.returncode == 0, first.stderr
    assert "5 written, 0 skipped, 2 failed" in first.stdout, first.stdout
    assert "2 rows wait for a retry after a failure" in first.stdout
    assert "leased by a worker that stopped" not in first.stdout
    with db.connection(db_url) as conn:
        assert _embedded(conn) == 5
        queued = conn.execute(
            "SELECT key, attempts, claimed_by, last_error FROM pgembed.queue ORDER BY key"
        ).fetchall()
        assert [(k, a, c) for k, a, c, _ in queued] == [("3", 1, None), ("6", 1, None)]
        assert all(f"row {k} may have no vector" in e for k, _, _, e in queued), queued
        assert make_due(conn) == 2  # the retry's backoff over
    second = run_cli_here(*sync)
    assert "0 written, 0 skipped, 2 failed" in second.stdout, second.stdout
    assert "leased by a worker that stopped" not in second.stdout
    with db.connection(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
        failures = conn.execute(
            "SELECT key, attempts, error FROM pgembed.failures ORDER BY key"
        ).fetchall()
        assert [(k, a) for k, a, _ in failures] == [("3", 2), ("6", 2)]
        assert all(f"row {k} may have no vector" in e for k, _, e in failures), failures
        assert _embedded(conn) == 5
    (report,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    assert report["failed"] == 2 and report["queued"] == 0 and report["rows_embedded"] == 5


_REFUSE_OTHERWISE = (
    # Row 3: a trigger that ends without RETURN (SQLSTATE 2F005, which psycopg raises as an
    # OperationalError); row 6: a deferred constraint trigger, checked at the commit.
    "CREATE FUNCTION public.no_return() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN IF NEW.id = 3 AND NEW.embedding_minilm IS NOT NULL THEN NULL; "
    "ELSE RETURN NEW; END IF; END$$; "
    "CREATE TRIGGER no_return BEFORE UPDATE ON public.docs FOR EACH ROW "
    "EXECUTE FUNCTION public.no_return(); "
    "CREATE FUNCTION public.later() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN IF NEW.id = 6 AND NEW.embedding_minilm IS NOT NULL THEN "
    "RAISE EXCEPTION 'row 6 refused at commit'; END IF; RETURN NULL; END$$; "
    "CREATE CONSTRAINT TRIGGER later AFTER UPDATE ON public.docs DEFERRABLE INITIALLY DEFERRED "
    "FOR EACH ROW EXECUTE FUNCTION public.later();"
)


def test_a_missing_return_and_a_deferred_check_fail_their_rows_too(db_url: str) -> None:
    """Refusals of other kinds, on a direct write: a trigger's error that psycopg classes as
    operational, and a check deferred to the commit. Each fails its row's attempt like any
    refusal (before, the first had the worker reconnect for ever, the second left its batch
    leased); the other rows are written."""
    _syncers_docs(db_url, _REFUSE_OTHERWISE)
    done = run_cli_here("--database-url", db_url, "sync", "--once", "--claim-size", "4")
    assert "5 written, 0 skipped, 2 failed" in done.stdout, done.stdout + done.stderr
    assert "leased by a worker that stopped" not in done.stdout
    with db.connection(db_url) as conn:
        assert _embedded(conn) == 5
        queued = dict(conn.execute("SELECT key, last_error FROM pgembed.queue").fetchall())
    assert set(queued) == {"3", "6"}
    assert "without RETURN" in queued["3"] and "row 6 refused at commit" in queued["6"], queued


def test_a_revoked_update_of_the_vector_column_is_said_not_failed(
    db_url: str, make_role: Callable[..., str]
) -> None:
    """A daemon that may no longer UPDATE the vector column of a table it writes directly: the
    model is skipped with the GRANT to run and who runs it; no row is failed for it."""
    with db.connection(db_url) as conn:
        roles.create(conn)
        owner = make_role("owner")
        daemon = make_role("daemon", f"IN ROLE {roles.DAEMON}")
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(daemon)))
        conn.execute(
            sql.SQL("GRANT {} TO {} WITH ADMIN OPTION, INHERIT FALSE, SET FALSE").format(
                sql.Identifier(daemon), sql.Identifier(owner)
            )
        )
        conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
        conn.execute(sql.SQL("ALTER TABLE public.docs OWNER TO {}").format(sql.Identifier(owner)))
        conn.execute("INSERT INTO public.docs SELECT g, 'doc ' || g FROM generate_series(1, 3) g")
        models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
        conn.execute("REVOKE UPDATE (embedding_minilm) ON public.docs FROM pgembed_daemon")
    daemon_url = with_user(db_url, daemon)
    stats = _sync(daemon_url)
    assert stats.written == 0 and stats.failed == 0
    (report,) = pgembed.status(database_url=daemon_url)
    assert report["queued"] == 3 and report["failed"] == 0
    assert (
        f'GRANT UPDATE ("embedding_minilm") ON public.docs TO pgembed_daemon, run by the table\'s '
        f"owner {owner}"
    ) in report["broken"], report["broken"]
