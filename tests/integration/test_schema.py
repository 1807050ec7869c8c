"""`pgembed migrate` (the migrations, then the definitions) builds exactly the schema that
pgembed/sql/schema/*.sql (the tables) and pgembed/sql/definitions/*.sql (functions, triggers,
grants) define, and the generated pgembed.search matches its snapshots in
tests/integration/snapshots/.

Regenerate the snapshots after an intended change to the search compiler with
PGEMBED_UPDATE_SNAPSHOTS=1 (then review their diff).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

import pgembed
from pgembed import db, migrate, roles
from schema_helpers import describe

Conn = psycopg.Connection[TupleRow]

SCHEMA_DIR = Path(pgembed.__file__).parent / "sql" / "schema"
DEFINITIONS_DIR = Path(pgembed.__file__).parent / "sql" / "definitions"
SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
UPDATE_VARIABLE = "PGEMBED_UPDATE_SNAPSHOTS"
SEARCH = "pgembed.search(text, vector, integer, jsonb)"


def schema_files() -> list[Path]:
    """The reference, in the order a reader would run it: tables, then definitions."""
    return sorted([*SCHEMA_DIR.glob("*.sql"), *DEFINITIONS_DIR.glob("*.sql")], key=lambda p: p.name)


def differences(migrated: dict[str, str], reference: dict[str, str]) -> list[str]:
    """One readable entry per object missing from one side or defined differently."""
    found = []
    for key in sorted(migrated.keys() | reference.keys()):
        if key not in reference:
            found.append(
                f"{key}: made by the migrations, missing from sql/schema/ and sql/definitions/"
            )
        elif key not in migrated:
            found.append(f"{key}: defined in sql/schema/ or sql/definitions/, not made by migrate")
        elif migrated[key] != reference[key]:
            diff = difflib.unified_diff(
                reference[key].splitlines(keepends=True),
                migrated[key].splitlines(keepends=True),
                fromfile=f"sql/schema/ + sql/definitions/: {key}",
                tofile=f"migrations: {key}",
            )
            found.append("".join(diff))
    return found


def test_migrations_yield_the_current_schema(empty_db_url: str, other_empty_db_url: str) -> None:
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn)
        applied = conn.execute("SELECT version FROM pgembed.migrations ORDER BY 1").fetchall()
        assert [v for (v,) in applied] == [m.version for m in migrate.available()]
        migrated = describe(conn)
    files = schema_files()
    assert files, f"no schema files in {SCHEMA_DIR}"
    # As a reader would run them with psql: the role's own search_path, where the extension goes.
    with psycopg.connect(other_empty_db_url, autocommit=True) as conn:
        for path in files:
            with conn.transaction():
                conn.execute(path.read_bytes())
        # As migrate does: the roles' grants, where an earlier test made the (cluster's) roles.
        roles.grant(conn)
        reference = describe(conn)
    for description in (migrated, reference):
        assert "extension vector" in description
        assert "function pgembed.search(model text, query vector, k integer, filter jsonb)" in (
            description
        )
    problems = differences(migrated, reference)
    if problems:
        pytest.fail(
            f"{len(problems)} object(s) differ between `pgembed migrate` and pgembed/sql/schema/ "
            "+ sql/definitions/ (- the files, + migrate):\n\n" + "\n".join(problems),
            pytrace=False,
        )


# --- The generated pgembed.search, compared with its snapshots --------------------------------

SAMPLE_MODEL = """
INSERT INTO pgembed.models (
    name, table_schema, table_name, key_column, key_type, text_column, text_columns,
    embedding_column, model_ref, pooling, normalize, dimensions, max_seq_length)
VALUES ('sample', 'public', 'docs', 'id', 'integer', 'body', '{body}', 'embedding_sample',
        'sentence-transformers/all-MiniLM-L6-v2', 'mean', true, 3, 256)
"""


def generated_search(conn: Conn) -> str:
    row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (SEARCH,)).fetchone()
    assert row is not None
    return str(row[0])


def snapshot_mismatch(name: str, what: str, generated: str) -> str | None:
    """None when snapshots/<name> holds `generated` (or was just rewritten to); else a diff."""
    path = SNAPSHOT_DIR / name
    text = (
        f"-- {what}: pg_get_functiondef of {SEARCH}.\n"
        f"-- Written by tests/integration/test_schema.py with {UPDATE_VARIABLE}=1; do not edit.\n"
        f"{generated}"
    )
    if os.environ.get(UPDATE_VARIABLE) == "1":
        SNAPSHOT_DIR.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return None
    stored = path.read_text(encoding="utf-8") if path.exists() else ""
    if stored == text:
        return None
    diff = difflib.unified_diff(
        stored.splitlines(keepends=True),
        text.splitlines(keepends=True),
        fromfile=f"tests/integration/snapshots/{name}",
        tofile="generated",
    )
    return f"{what} differs from {path.name}:\n" + "".join(diff)


def test_generated_search_matches_the_snapshot(db_url: str) -> None:
    with db.connection(db_url) as conn:
        empty = generated_search(conn)
        conn.execute(
            "CREATE TABLE docs (id integer PRIMARY KEY, body text, embedding_sample vector(3))"
        )
        conn.execute(
            "INSERT INTO docs VALUES (1, 'one', '[1,0,0]'), (2, 'two', '[0,1,0]'), "
            "(3, 'three', '[0.9,0.1,0]')"
        )
        # Autocommit: the deferred recompile_search trigger rebuilds the function at the commit.
        conn.execute(SAMPLE_MODEL.encode())
        sample = generated_search(conn)
        # The generated branch runs, nearest first.
        hits = conn.execute("SELECT key FROM pgembed.search('sample', '[1,0,0]', 2)").fetchall()
        assert hits == [("1",), ("3",)]
        conn.execute(
            "UPDATE pgembed.models SET ef_search = 100, first_walk_ef_search = 40, "
            "second_walk_ef_search = 1000, second_walk_mean_distance = 0.42 WHERE name = 'sample'"
        )
        two_walks = generated_search(conn)
    assert "WHEN 'sample' THEN" in sample and "WHEN NULL THEN NULL;" in empty
    assert "first_keys := keys" in two_walks and "first_keys := keys" not in sample
    problems = [
        problem
        for problem in (
            snapshot_mismatch("search_empty.sql", "pgembed.search with no model", empty),
            snapshot_mismatch(
                "search_sample.sql", "pgembed.search with one model, 'sample' (3 dims)", sample
            ),
            snapshot_mismatch(
                "search_two_walks.sql", "pgembed.search with 'sample' given two walks", two_walks
            ),
        )
        if problem
    ]
    if problems:
        pytest.fail(
            "\n".join(problems) + f"\nIf the change is intended, regenerate the snapshots with "
            f"{UPDATE_VARIABLE}=1 .venv/bin/python -m pytest tests/integration/test_schema.py "
            "and review their diff.",
            pytrace=False,
        )
