"""k: the sync daemon's memory with one huge row: peak RSS of `pgembed sync --once` (a fresh
process) on a table of ordinary rows, and on a table whose only row is 100 MB of text.

The huge row is made by the server (`string_agg` of md5 hex words), so this process never holds
it; the daemon reads only the characters its model can read (sync/store.py `read`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from bench.env import Database, create_reviews, generated_corpus
from pgembed import defaults
from pgembed.lifecycle import models

HUGE_MB = 100


@dataclass(frozen=True)
class Run:
    what: str
    rows: int
    longest_bytes: int  # the longest text
    peak_rss_mb: float
    seconds: float
    written: int
    truncated: int


@dataclass(frozen=True)
class BigRow:
    normal: Run
    huge: Run

    @property
    def ratio(self) -> float:
        return self.huge.peak_rss_mb / self.normal.peak_rss_mb


# The child reports its own peak: wait4's ru_maxrss starts from the parent's RSS at the fork
# (Linux carries the old address space's high-water mark across exec), which after the engines
# section is this benchmark's gigabytes, not the daemon's. VmHWM belongs to the new one.
_REPORT_PEAK = """
import atexit, os, runpy, sys
def report():
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:")).split()[1]
    with open(os.environ["PGEMBED_BENCH_PEAK"], "w") as out:
        out.write(peak)
atexit.register(report)
sys.argv = ["pgembed", *sys.argv[1:]]
runpy.run_module("pgembed", run_name="__main__")
"""


def _sync_once(url: str, model: str) -> tuple[float, float]:
    """Peak RSS (MB) and wall seconds of one `pgembed sync --once --model MODEL` process."""
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        command = [sys.executable, "-c", _REPORT_PEAK, "--database-url", url, "sync", "--once"]
        env = {**os.environ, "PGEMBED_BENCH_PEAK": peak.name}
        started = time.monotonic()
        subprocess.run([*command, "--model", model], stdout=subprocess.DEVNULL, env=env, check=True)
        seconds = time.monotonic() - started
        return int(peak.read()) / 1024, seconds  # kilobytes


def _huge_table(conn: psycopg.Connection, megabytes: int) -> None:
    conn.execute("DROP TABLE IF EXISTS public.bigrow_huge")
    conn.execute("CREATE TABLE public.bigrow_huge (id integer PRIMARY KEY, body text NOT NULL)")
    words = megabytes * 1_000_000 // 33  # 32 hex characters and a space each
    conn.execute(
        "INSERT INTO public.bigrow_huge SELECT 1, pg_catalog.string_agg(pg_catalog.md5(g::text), "
        "' ') FROM pg_catalog.generate_series(1, %s) g",
        (words,),
    )


def _run(database: Database, table: str, what: str) -> Run:
    model, name = table, sql.Identifier("public", table)
    with database.connect() as conn:
        # One precision for both: `auto` may choose differently for different texts.
        models.add(conn, models.AddRequest(model, f"public.{table}", "body", precision="fp32"))
        count = sql.SQL("SELECT pg_catalog.count(*), pg_catalog.max(pg_catalog.octet_length(body))")
        rows, longest = _one(conn, sql.SQL("{} FROM {}").format(count, name))
    peak, seconds = _sync_once(database.url, model)
    with database.connect() as conn:
        column = sql.Identifier(f"embedding_{model}")
        (written,) = _one(conn, sql.SQL("SELECT pg_catalog.count({}) FROM {}").format(column, name))
        truncated = sql.SQL("SELECT pg_catalog.count(*) FROM pgembed.truncated WHERE model = {}")
        (marked,) = _one(conn, truncated.format(model))
        models.remove(conn, model)
        conn.execute(sql.SQL("DROP TABLE {}").format(name))
    return Run(what, rows, longest, peak, seconds, written, marked)


def _one(conn: psycopg.Connection, query: sql.Composed) -> tuple[int, ...]:
    row = conn.execute(query).fetchone()
    assert row is not None
    return tuple(row)


def measure(database: Database, rows: int = defaults.CPU_CLAIM_SIZE) -> BigRow:
    with database.connect() as conn:
        create_reviews(conn, generated_corpus(rows, seed=5), table="public.bigrow_normal")
    normal = _run(database, "bigrow_normal", f"{rows} ordinary rows (~200 characters)")
    with database.connect() as conn:
        _huge_table(conn, HUGE_MB)
    huge = _run(database, "bigrow_huge", f"one row of {HUGE_MB} MB")
    return BigRow(normal, huge)
