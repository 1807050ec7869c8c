"""Migrations from 0013 on hold only what runs once: a function, trigger, view or grant has its
one definition in pgembed/sql/definitions/, which `pgembed migrate` re-applies."""

from __future__ import annotations

import re

from pgembed import migrate

# The first migration of the one-definition layout; older files keep the bodies of their day.
FIRST = 13
_DEFINED_ELSEWHERE = re.compile(
    r"^\s*(CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|(CONSTRAINT\s+)?TRIGGER|VIEW)"
    r"|GRANT\s|REVOKE\s|COMMENT\s+ON\s+FUNCTION)",
    re.IGNORECASE | re.MULTILINE,
)


def test_new_migrations_define_no_function() -> None:
    for migration in migrate.available():
        if migration.version < FIRST:
            continue
        body = "\n".join(
            line for line in migration.sql.splitlines() if not line.lstrip().startswith("--")
        )
        found = _DEFINED_ELSEWHERE.search(body)
        assert found is None, (
            f"{migration.filename} has `{found.group(0).strip()}`: define it in "
            "pgembed/sql/definitions/ (a migration may only DROP what OR REPLACE cannot change)"
        )


def test_definitions_are_safe_to_run_again() -> None:
    """Every CREATE in a definition file replaces (a constraint trigger, which cannot, is
    dropped just before)."""
    for definition in migrate.definitions():
        text = definition.sql
        for match in re.finditer(r"^CREATE\s+(?!OR\s+REPLACE)(.*)$", text, re.MULTILINE):
            statement = match.group(1)
            assert statement.startswith("CONSTRAINT TRIGGER"), (definition.file, statement)
            name = statement.split()[2]
            assert f"DROP TRIGGER IF EXISTS {name} " in text, (definition.file, name)
