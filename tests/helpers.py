"""Shared test data, CLI runners and throwaway databases (importable from every tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
from click.testing import CliRunner, Result
from pgvector import Vector
from psycopg import sql

from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.cli import main
from pgembed.lifecycle import models
from pgembed.search import planner
from pgembed.search.plan import execute
from pgembed.search.planner import Hit, HybridHit, SearchRequest
from pgembed.sync import batch

REVIEWS = [
    (1, "The battery dies before lunch, I have to charge it twice a day."),
    (2, "Phone can't make it through the morning without being plugged in."),
    (3, "These apples are crisp, sweet and juicy."),
    (4, "The charger gets very hot and stopped working after a week."),
    (5, "Shipping took three weeks and the box arrived crushed."),
    (6, "Great noise cancelling headphones, silence on the train."),
    (7, "Baked an apple pie with these, the fruit held its shape."),
    (8, "Customer service never answered my emails."),
]


def with_database(url: str, dbname: str) -> str:
    """`url` with its database name replaced."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@contextmanager
def database(server_url: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database `<prefix>_<random>` on the server (a copy of database `template` if given):
    its URL. Dropped on the way out, WITH (FORCE), so connections left open do not keep it.

    Every test database is made here: the per-test fixtures, the session templates they copy,
    and bench/env.py's benchmark database.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(create)
    try:
        yield with_database(server_url, name)
    finally:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(drop)


def cli(*args: str, env: dict[str, str] | None = None, prog_name: str | None = None) -> Result:
    """Run the CLI in-process (the model stays loaded between calls); `env` is added to the
    environment for the call only."""
    return CliRunner().invoke(
        main, list(args), env=env, prog_name=prog_name, catch_exceptions=False
    )


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real `pgembed` executable as a subprocess: for what only a process shows (its
    exit on a signal, its output's buffering, the embedded server's life across processes).
    Each start imports the package again, torch too for a command that encodes (0.5-4 s)."""
    return subprocess.run(
        [sys.executable, "-m", "pgembed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).parent.parent,
    )


def run_cli_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`run_cli`'s answer (exit code, stdout, stderr apart) from the same click group run in
    this process, as the installed `pgembed` names itself: for what the CLI prints and exits
    with, where a process start is not the subject. A traceback fails the test instead of
    reaching stderr; `env` is added to the environment for the call only."""
    result = cli(*args, env=env, prog_name="pgembed")
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


@contextmanager
def writing_vectors(conn: psycopg.Connection) -> Iterator[None]:
    """Vectors written directly, flagged as the sync worker flags its own (pgembed.writing): a
    vector an INSERT or COPY brings is otherwise taken for one written by hand, and cleared."""
    conn.execute("SET pgembed.writing = on")
    try:
        yield
    finally:
        conn.execute("RESET pgembed.writing")


@contextmanager
def hnsw_built_after(conn: psycopg.Connection, *tables: str) -> Iterator[None]:
    """The HNSW indexes of `tables` dropped, then built again from their own definitions once
    the block has loaded the rows: a build over thousands of vectors is about 6x faster than
    inserting them into the graph one by one, and how the index came to be is not what the
    tests that load random vectors are about."""
    found = conn.execute(
        "SELECT n.nspname, c.relname, pg_catalog.pg_get_indexdef(c.oid) "
        "FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_am a ON a.oid = c.relam "
        "WHERE a.amname = 'hnsw' AND i.indrelid = ANY(%s::regclass[])",
        ([sql.Identifier(table).as_string(conn) for table in tables],),
    ).fetchall()
    for schema, name, _ in found:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))
    try:
        yield
    finally:
        for _, _, definition in found:
            conn.execute(definition)


def make_due(conn: psycopg.Connection) -> int:
    """Every postponed or leased queue entry ready to be claimed now, as waiting out its pause or
    lease would make it (instead of sleeping for it): how many were not ready yet. What a pause
    or a lease lasts is tested where it is the subject (test_app_locks, test_leases)."""
    cur = conn.execute(
        "UPDATE pgembed.queue SET next_attempt_at = pg_catalog.now() "
        "WHERE next_attempt_at > pg_catalog.now()"
    )
    return cur.rowcount


def make_items(
    conn: psycopg.Connection, rows: int = 3000, rare_every: int = 50
) -> registry.ModelSpec:
    """`items` (id, body, bucket, note) watched by model `minilm`, with random unit vectors
    written directly: big enough for the planner to pick the HNSW index, without embedding
    thousands of texts. `bucket = 'rare'` on every `rare_every`-th row (2 % by default);
    `note` is NULL on every third row."""
    conn.execute("CREATE TABLE items (id integer PRIMARY KEY, body text, bucket text, note text)")
    spec = models.add(conn, models.AddRequest("minilm", "items", "body", precision="fp32"))[0]
    vectors = np.random.default_rng(7).normal(size=(rows, spec.dimensions)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    copy = "COPY items (id, body, bucket, note, embedding_minilm) FROM STDIN (FORMAT BINARY)"
    loading = hnsw_built_after(conn, "items")
    with loading, writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
        out.set_types(["integer", "text", "text", "text", "vector"])
        for i, vector in enumerate(vectors):
            bucket = "rare" if i % rare_every == 0 else "common"
            note = None if i % 3 == 0 else f"note {i % 5}"
            out.write_row((i, f"item number {i}", bucket, note, Vector(vector)))
    conn.execute("DELETE FROM pgembed.inbox")  # the vectors are already there
    conn.execute("DELETE FROM pgembed.queue")
    conn.execute("ANALYZE items")
    return spec


@contextmanager
def plans(conn: psycopg.Connection) -> Iterator[list[str]]:
    """The plan of every statement run inside, nested ones (the SQL helpers' own) included."""
    found: list[str] = []
    conn.add_notice_handler(lambda diag: found.append(diag.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_level = notice",
    ):
        conn.execute(setting)
    yield found
    conn.execute("SET auto_explain.log_min_duration = -1")


def run_batch(
    conn: psycopg.Connection, spec: ModelSpec, config: batch.BatchConfig
) -> batch.BatchResult | None:
    """One batch without overlap (fetch, embed, write back); None when nothing is ready."""
    started = time.monotonic()
    claimed = batch.fetch(conn, spec, config)
    if claimed is None:
        return None
    result = batch.embed(claimed, config)
    return batch.write_back(conn, claimed, result, config, time.monotonic() - started)


def post_json(url: str, body: object) -> tuple[int, Any]:
    """POST `body` as JSON (as `pgembed serve` takes it): the status and the decoded answer."""
    data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def search_on(
    conn: psycopg.Connection, spec: ModelSpec, **request: Any
) -> list[Hit] | list[HybridHit]:
    """A search (SearchRequest's fields: vector=, similar_to=, text= with hybrid=True, k, ...) on
    this spec of its model, which may be older than the catalog's, as the front ends plan one."""
    return execute(conn, planner.plan_for(spec, SearchRequest(spec.name, **request)))
