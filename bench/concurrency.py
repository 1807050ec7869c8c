"""Serving many clients (`python -m bench --only concurrency`): `pgembed serve` under 1, 4, 16
and 64 concurrent keep-alive clients, each sending its own distinct texts (no query-vector cache
hit), k = 10: requests per second, client-side p50 and p95, errors. Three cases: a plain model,
a chunked model (long_texts = chunk: its chunk windows searched too), and the plain model with a
filter. One more row at 16 clients with batching off (--batch-size 1), as every query was
encoded before dynamic batching.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bench import serve
from bench.env import Database, create_reviews, generated_corpus, median, percentile
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.sync import worker

CLIENTS = (1, 4, 16, 64)
SECONDS = 10.0  # each cell's measured time, after a warm-up
TABLE = "conc_reviews"
PLAIN, CHUNKED = "conc_plain", "conc_chunked"
FILTER = {"rating": {"$gte": 3}}
START, END = "<!-- bench:concurrency:start -->", "<!-- bench:concurrency:end -->"


@dataclass(frozen=True)
class Cell:
    case: str
    clients: int
    batching: bool
    requests: int
    seconds: float
    p50_ms: float
    p95_ms: float
    errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


@dataclass(frozen=True)
class Run:
    cells: list[Cell]
    load_average: float
    rows: int


def _setup(database: Database, rows: int) -> None:
    texts = generated_corpus(rows, seed=5)
    with database.connect() as conn:
        create_reviews(conn, texts, TABLE)
        conn.execute(f"ALTER TABLE {TABLE} ADD COLUMN rating integer")
        conn.execute(f"UPDATE {TABLE} SET rating = id % 5 + 1")
        models.add(conn, models.AddRequest(PLAIN, TABLE, "body"))
        models.add(conn, models.AddRequest(CHUNKED, TABLE, "body", long_texts="chunk"))
    worker.Worker(database.url, worker.Options(models=(PLAIN, CHUNKED), once=True)).run()
    with database.connect() as conn:
        conn.execute(f"ANALYZE {TABLE}")
        assert registry.get(conn, CHUNKED).chunked


@contextmanager
def _served(url: str, *names: str, options: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """bench/serve.py's `pgembed serve` process, its address as asyncio takes it."""
    with serve.served(url, *names, options=options) as address:
        host, port = address.rsplit(":", 1)
        yield host, int(port)


class _Texts:
    """Distinct query texts, handed out once each across every client."""

    def __init__(self, tag: str) -> None:
        self._base = generated_corpus(500, seed=123)
        self._n = 0
        self._tag = tag

    def next(self) -> str:
        self._n += 1
        return f"{self._base[self._n % len(self._base)]} ({self._tag} {self._n})"


async def _client(
    address: tuple[str, int],
    case: str,
    model: str,
    texts: _Texts,
    latencies: list[float],
    errors: list[int],
    measuring: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    """One keep-alive client: a request, its whole answer, the next. Written on asyncio streams
    so 64 clients are one thread of the benchmark, not 64 threads fighting for its GIL."""
    reader, writer = await asyncio.open_connection(*address)
    while not stop.is_set():
        body: dict[str, object] = {"text": texts.next(), "model": model, "k": 10}
        if case == "filter":
            body["filter"] = FILTER
        payload = json.dumps(body).encode()
        head = (
            f"POST /search HTTP/1.1\r\nHost: {address[0]}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        began = time.perf_counter()
        try:
            writer.write(head.encode() + payload)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            ok = status_line.split(b" ")[1:2] == [b"200"]
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            ok = False
            writer.close()
            reader, writer = await asyncio.open_connection(*address)
        if measuring.is_set() and not stop.is_set():
            if ok:
                latencies.append((time.perf_counter() - began) * 1000)
            else:
                errors.append(1)
    writer.close()


def _cell(address: tuple[str, int], case: str, model: str, clients: int, batching: bool) -> Cell:
    async def run() -> Cell:
        texts = _Texts(f"{case}-{clients}-{batching}")
        latencies: list[float] = []
        errors: list[int] = []
        measuring, stop = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(
                _client(address, case, model, texts, latencies, errors, measuring, stop)
            )
            for _ in range(clients)
        ]
        await asyncio.sleep(2.0)  # warm-up: connections, pages
        measuring.set()
        began = time.perf_counter()
        await asyncio.sleep(SECONDS)
        stop.set()
        seconds = time.perf_counter() - began
        await asyncio.gather(*tasks)
        return Cell(
            case,
            clients,
            batching,
            len(latencies),
            seconds,
            median(latencies) if latencies else float("nan"),
            percentile(latencies, 95) if latencies else float("nan"),
            len(errors),
        )

    return asyncio.run(run())


def measure(database: Database, rows: int = 2000) -> Run:
    _setup(database, rows)
    load_average = os.getloadavg()[0]
    cells: list[Cell] = []
    with _served(database.url, PLAIN, CHUNKED) as address:
        for case, model in (("plain", PLAIN), ("chunked", CHUNKED), ("filter", PLAIN)):
            for clients in CLIENTS:
                cells.append(_cell(address, case, model, clients, True))
                print(_row(cells[-1]), flush=True)
    with _served(database.url, PLAIN, options=("--batch-size", "1")) as address:
        cells.append(_cell(address, "plain", PLAIN, 16, False))
        print(_row(cells[-1]), flush=True)
    return Run(cells, load_average, rows)


_CASES = {
    "plain": "plain model",
    "chunked": "chunked model (long_texts = chunk)",
    "filter": 'plain model, filter {"rating": {"$gte": 3}}',
}


def _row(c: Cell) -> str:
    batching = "" if c.batching else ", batching off (--batch-size 1)"
    return (
        f"| {_CASES[c.case]}{batching} | {c.clients} | {c.rate:.0f} | {c.p50_ms:.1f} ms "
        f"| {c.p95_ms:.1f} ms | {c.errors} |"
    )


def report(run: Run) -> str:
    lines = [
        "| case | clients | req/s | p50 | p95 | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(_row(c) for c in run.cells),
    ]
    by = {(c.case, c.clients, c.batching): c for c in run.cells}
    one, sixteen = by.get(("plain", 1, True)), by.get(("plain", 16, True))
    if one and sixteen:
        ratio = sixteen.rate / one.rate
        met = "met" if ratio >= 3 and sixteen.p50_ms <= 100 else "NOT met"
        lines.append("")
        lines.append(
            f"16 clients against 1, plain model: {ratio:.1f}x the requests per second, p50 "
            f"{sixteen.p50_ms:.1f} ms (target >= 3x and p50 <= 100 ms: {met})."
        )
    return "\n".join(lines)


def document(run: Run, machine: str, command: str, seconds: float) -> str:
    return "\n".join(
        [
            START,
            "",
            "## Serving many clients (`python -m bench --only concurrency`)",
            "",
            f"Run {time.strftime('%Y-%m-%d')} in {seconds / 60:.1f} min: `{command}`. Machine: "
            f"{machine}. 1-minute load average at the start: {run.load_average:.2f} (the "
            "machine is shared: 2 cores, other sessions running). `pgembed serve` on "
            f"{run.rows:,} review rows; every request a distinct text (no query-vector cache "
            f"hit), k = 10, one keep-alive connection per client (asyncio streams, one thread), "
            f"{SECONDS:.0f} s measured per row after 2 s of warm-up; client-side latency.",
            "",
            report(run),
            "",
            END,
        ]
    )
