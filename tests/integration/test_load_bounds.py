"""`pgembed load` in bounded memory: a file with no line end, a huge field or a NUL is refused
with one line, never read whole (/dev/zero once grew a load to 22 GB before the OOM killer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgembed import defaults

# The load runs in a process whose address space is capped: the old reader (a whole line at a
# time) would raise MemoryError here; the loader's own peak for a 16 MiB field is ~300 MB.
ADDRESS_SPACE = 1024 * 2**20
BOUNDED = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE})); "
    "sys.argv = ['pgembed', *sys.argv[1:]]; runpy.run_module('pgembed', run_name='__main__')"
)
BIG = defaults.MAX_RECORD_BYTES


def load_bounded(
    db_url: str, path: Path | str, table: str, *args: str
) -> subprocess.CompletedProcess[str]:
    command = ["--database-url", db_url, "load", str(path), "--table", table, *args]
    return subprocess.run(
        [sys.executable, "-c", BOUNDED, *command],
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_refused(result: subprocess.CompletedProcess[str], where: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"pgembed: error: {where}: "), lines


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_file_with_no_line_end_is_refused(db_url: str, fmt: str) -> None:
    result = load_bounded(db_url, "/dev/zero", "zeros", "--format", fmt)
    assert_refused(result, "/dev/zero:1")
    assert f"a record longer than {BIG // 2**20} MiB" in result.stderr


def test_huge_fields_are_refused_where_they_start(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    one_line = tmp_path / "field.csv"
    with one_line.open("w") as f:
        f.write('id,body\n1,"a short review"\n2,"' + "word " * (BIG // 5 + 1) + '"\n')
    assert_refused(load_bounded(db_url, one_line, "t"), f"{one_line}:3")
    # A quoted field across many lines, each short: the row is bounded, not only the line.
    many_lines = tmp_path / "lines.csv"
    with many_lines.open("w") as f:
        f.write('id,body\n1,"' + "a line\n" * (BIG // 7 + 1) + '"\n')
    assert_refused(load_bounded(db_url, many_lines, "t"), f"{many_lines}:2")
    jsonl = tmp_path / "long.jsonl"
    with jsonl.open("w") as f:
        f.write('{"id": 1, "text": "' + "x" * BIG + '"}\n')
    assert_refused(load_bounded(db_url, jsonl, "t"), f"{jsonl}:1")
    assert conn.execute("SELECT to_regclass('public.t')").fetchone() == (None,)


def test_a_field_under_the_bound_loads_in_bounded_memory(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "long.csv"
    with path.open("w") as f:
        f.write('id,body\n1,"' + "word " * ((BIG - 100) // 5) + '"\n')
    result = load_bounded(db_url, path, "long")
    assert result.returncode == 0, result.stderr[-2000:]
    assert conn.execute("SELECT length(body) FROM long").fetchone() == ((BIG - 100) // 5 * 5,)


def test_a_nul_byte_is_one_line(conn: psycopg.Connection, db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "nul.csv"  # the csv module's own error was a traceback
    path.write_bytes(b'id,body\n1,fine\n2,"a \x00 b"\n')
    result = load_bounded(db_url, path, "t")
    assert_refused(result, f"{path}:3")
    assert "a NUL byte at byte offset 20: PostgreSQL text cannot hold it" in result.stderr
