"""i: a cold `pgembed query` process against the same texts in a warm process (`pgembed serve`);
j: `pgembed serve` POST /search latency over HTTP at 100k rows.

Both against real processes. The 100k-row table carries random unit vectors (written directly,
as tests/helpers.make_items does: embedding 100k texts takes an hour on a CPU); each query is
still embedded by the model, in the process that serves it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from bench.capture import Row
from bench.env import Database, create_reviews, generated_corpus, median, percentile
from pgembed.catalog import ddl, naming, registry
from pgembed.lifecycle import models
from pgembed.sync import worker

BIG = "serve_big"  # the 100k-row table, and its model's name
COLD_RUNS = 5


@dataclass(frozen=True)
class Serve:
    load_average: float  # the 1-minute load average when the cold runs started
    cold_s: float  # median wall time of a fresh `pgembed query` process
    cold_full_s: float  # the same with PGEMBED_LIGHT_ENCODER=0 (sentence-transformers imported)
    warm_ms: float  # median client-side time of the same texts, one request each, warm server
    rows: int
    requests: int
    p50_ms: float
    p95_ms: float
    server_p50_ms: float  # the server's own took_ms
    precision: str


def _query_cmd(url: str, text: str) -> list[str]:
    base = [sys.executable, "-m", "pgembed", "--database-url", url]
    return [*base, "query", text, "--model", "minilm", "-k", "10"]


def _cold(url: str, texts: list[str], light: bool) -> float:
    env = {**os.environ, "PGEMBED_LIGHT_ENCODER": "1" if light else "0"}
    seconds = []
    for text in texts:
        started = time.perf_counter()
        subprocess.run(_query_cmd(url, text), env=env, check=True, capture_output=True)
        seconds.append(time.perf_counter() - started)
    return median(seconds)


@contextmanager
def served(url: str, *names: str, options: Sequence[str] = ()) -> Iterator[str]:
    """A `pgembed serve` process for these models (and `serve` options), on a free port: its
    host:port."""
    args = [a for name in names for a in ("--model", name)] + list(options)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "--database-url", url, "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once every model is loaded
        if not line.startswith("serving http://"):
            raise RuntimeError(f"pgembed serve did not start: {line!r}")
        yield line.split("//", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()


class Http:
    """One keep-alive connection, as an application's HTTP client keeps one."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self._conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def search(self, body: dict[str, object]) -> tuple[float, dict[str, object]]:
        """Client-side seconds of one POST /search, and its answer."""
        payload = json.dumps(body).encode()
        started = time.perf_counter()
        self._conn.request("POST", "/search", payload, {"Content-Type": "application/json"})
        response = self._conn.getresponse()
        answer = json.loads(response.read())
        seconds = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"POST /search: {response.status} {answer}")
        return seconds, answer

    def close(self) -> None:
        self._conn.close()


def _ensure_minilm(database: Database, texts: list[str]) -> None:
    """Model `minilm` on `reviews`, as the throughput rows leave it; made here when they did
    not run (`--only serve`)."""
    with database.connect() as conn:
        if registry.exists(conn, "minilm"):
            return
        create_reviews(conn, texts)
        models.add(conn, models.AddRequest("minilm", "reviews", "body"))
    worker.Worker(database.url, worker.Options(models=("minilm",), once=True)).run()


def _big_table(database: Database, rows: int) -> None:
    """`serve_big` (id, product, rating, body): `rows` review rows, model `serve_big` with random
    unit vectors written directly and its HNSW index built once over them."""
    from bench.capture import _rows

    conn = database.connect()
    conn.execute(f"DROP TABLE IF EXISTS {BIG}")
    conn.execute(
        f"CREATE TABLE {BIG} (id integer PRIMARY KEY, product text NOT NULL, "
        "rating integer NOT NULL, body text NOT NULL)"
    )
    data: list[Row] = _rows(rows)
    with conn.cursor() as cur, cur.copy(f"COPY {BIG} (id, product, rating, body) FROM STDIN") as c:
        for row in data:
            c.write_row(row)
    spec = models.add(conn, models.AddRequest(BIG, BIG, "body"))[0]
    # The index is built once over every vector, not grown by 100k single inserts.
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(naming.index_name(spec))))
    vectors = np.random.default_rng(11).normal(size=(rows, spec.dimensions)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    conn.execute("CREATE TEMP TABLE serve_vectors (id integer PRIMARY KEY, v vector)")
    with conn.cursor() as cur, cur.copy("COPY serve_vectors FROM STDIN (FORMAT BINARY)") as c:
        c.set_types(["integer", "vector"])
        for (key, *_), vector in zip(data, vectors, strict=True):
            c.write_row((key, Vector(vector)))
    column = sql.Identifier(spec.embedding_column)
    # As the sync worker writes: a vector written otherwise is taken for one written by hand,
    # cleared and queued again (the capture trigger).
    conn.execute("SET pgembed.writing = on")
    conn.execute(
        sql.SQL("UPDATE {} t SET {} = s.v FROM serve_vectors s WHERE s.id = t.id").format(
            naming.table(spec), column
        )
    )
    conn.execute("RESET pgembed.writing")
    conn.execute("DELETE FROM pgembed.inbox WHERE model = %s", (BIG,))
    conn.execute("DELETE FROM pgembed.queue WHERE model = %s", (BIG,))
    conn.execute("SET maintenance_work_mem = '1GB'")
    ddl.create_index(conn, spec)
    conn.execute(f"ANALYZE {BIG}")
    conn.close()


def measure(database: Database, texts: list[str], queries: list[str], rows: int) -> Serve:
    _ensure_minilm(database, texts)
    _big_table(database, rows)
    with psycopg.connect(database.url) as conn:
        precision = str(registry.get(conn, BIG).precision)
    cold_texts = queries[:COLD_RUNS]
    load_average = os.getloadavg()[0]
    cold = _cold(database.url, cold_texts, light=True)
    cold_full = _cold(database.url, cold_texts, light=False)
    with served(database.url, "minilm", BIG) as address:
        client = Http(address)
        try:
            warm = [client.search({"text": t, "model": "minilm", "k": 10})[0] for t in cold_texts]
            for text in generated_corpus(10, seed=41):  # warm-up: connections, pages
                client.search({"text": text, "model": BIG, "k": 10})
            seconds, took = [], []
            for text in queries[COLD_RUNS:]:  # each text once: no query-vector cache hit
                wall, answer = client.search({"text": text, "model": BIG, "k": 10})
                assert len(answer["hits"]) == 10  # type: ignore[arg-type]
                seconds.append(wall * 1000)
                took.append(float(answer["took_ms"]))  # type: ignore[arg-type]
        finally:
            client.close()
    return Serve(
        load_average=load_average,
        cold_s=cold,
        cold_full_s=cold_full,
        warm_ms=median(warm) * 1000,
        rows=rows,
        requests=len(seconds),
        p50_ms=median(seconds),
        p95_ms=percentile(seconds, 95),
        server_p50_ms=median(took),
        precision=precision,
    )
