"""Trust, second round: nothing a watched table's owner defines (a trigger, a cast, a type) runs
with the privileges of the role that migrates or syncs. Each test plants the attack an audit
ran, as a non-superuser owner whose code tries to make itself SUPERUSER (or to read a table it
may not), and checks it stays powerless.

Roles are cluster-wide: each test makes its own (make_role) and drops them after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from roles_helpers import role_maker

import pgembed
from pgembed import db
from pgembed.errors import UsageError
from pgembed.lifecycle import models


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
