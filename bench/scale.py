"""Scale: a table of 10k, 100k and 1M reviews (`python -m bench --only scale`).

Per size, on a copy of a built dataset: the capture overhead of a bulk INSERT ... SELECT and a
server-side COPY (a watched table against the same unwatched one), `model add` on the full table
while an application inserts a row every 20 ms (the writer's longest wait), the first claim on
the fresh backlog (statistics as they are after the enqueue) and the claim p50, `pgembed
status`'s time, the queue's size at the backlog, after draining it and after the autovacuum
(pgembed.queue's settings, migration 0014), and an HNSW build over the table's vectors (time,
size, the backend's peak memory). Then the sync rows/s of 1, 2 and 4 `pgembed sync --once`
processes against one database, with the real model on real reviews.

Rows: the IMDb reviews (../shared/data/imdb-reviews, 50,000) repeated with a copy number
appended. Vectors: all-MiniLM-L6-v2's of 2,000 real reviews, embedded by the sync run; the
vector of row i mixes two of them and a little noise, normalised (real-looking neighbourhoods
without embedding a million texts). The built dataset (a database per size, and the real
vectors) lives in the embedded server of --scale-home, kept between runs: a second run starts
at the measurements.
"""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql

from bench.env import embedded_server, file_corpus
from pgembed import db, migrate
from pgembed.lifecycle import models, status
from pgembed.sync import store
from tests.daemon_helpers import claim_plan
from tests.helpers import with_database

START, END = "<!-- bench:scale:start -->", "<!-- bench:scale:end -->"
REVIEWS = Path(
    os.environ.get("PGEMBED_BENCH_REVIEWS")
    or Path(__file__).resolve().parents[2] / "shared/data/imdb-reviews/reviews.csv.gz"
)
SIZES = (10_000, 100_000, 1_000_000)
BASE = 400  # real reviews embedded by the sync run; the vectors of every size derive from them
WORKERS = (1, 2, 4)
CLAIM = 256  # the claim size of a CPU worker (defaults.claim_size)
DIM = 384


@dataclass
class Size:
    rows: int
    build_s: float = 0.0  # 0: the dataset was already built
    insert_select: tuple[float, float] = (0.0, 0.0)  # unwatched, watched (s)
    copy: tuple[float, float] = (0.0, 0.0)
    model_add_s: float = 0.0
    writer_max_ms: float = 0.0
    writer_p50_ms: float = 0.0
    writes: int = 0
    first_claim_ms: float = 0.0
    claim_p50_ms: float = 0.0
    claim_plan: str = ""
    status_ms: float = 0.0
    status_exact_ms: float = 0.0
    status_counts: str = ""
    queue_mb: dict[str, float] = field(default_factory=dict)
    index_s: float = 0.0
    index_mb: float = 0.0
    index_memory_mb: float = 0.0
    maintenance_work_mem: str = ""


@dataclass
class Workers:
    processes: int
    rows: int
    rows_per_s: float
    wall_s: float


def measure(
    home: Path, sizes: tuple[int, ...], url: str | None = None, sync: bool = True
) -> tuple[list[Workers], list[Size]]:
    """`sync`: measure the sync workers (and embed the base vectors); without it, the base
    vectors of an earlier run are reused."""
    server_url = url or embedded_server(home)
    cached = home / "base_vectors.npy"
    if sync or not cached.exists():
        base, workers = _sync_workers(server_url, home)
    else:
        base, workers = np.load(cached), []
    results = []
    for rows in sizes:
        results.append(_measure_size(server_url, home, rows, base))
        print(report(workers, results), flush=True)
    return workers, results


# --- the dataset ---------------------------------------------------------------------------


def _texts(n: int) -> list[str]:
    return file_corpus(REVIEWS, n)


def _source(server_url: str, home: Path, rows: int, base: np.ndarray) -> tuple[str, float]:
    """The database of a size's dataset, built once: reviews(id, body), vectors(id, embedding)
    and a server-side COPY file of the reviews."""
    name = f"pgembed_scale_{rows}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if found:
            return name, 0.0
        started = time.perf_counter()
        building = sql.Identifier(name + "_building")  # a build that was interrupted: again
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(building))
    url = with_database(server_url, name + "_building")
    texts = _texts(50_000)
    with db.connection(url) as conn:
        migrate.migrate(conn)
    with db.connection(url) as conn:  # pgvector's types known from the start
        conn.execute("CREATE TABLE reviews (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute(f"CREATE TABLE vectors (id bigint PRIMARY KEY, embedding vector({DIM}))")
        with conn.cursor() as cur, cur.copy("COPY reviews (id, body) FROM STDIN") as copy:
            for i in range(rows):
                copy.write_row((i, f"{texts[i % len(texts)]} (copy {i // len(texts)})"))
        rng = np.random.default_rng(24)
        step = 50_000
        binary = "COPY vectors (id, embedding) FROM STDIN (FORMAT BINARY)"
        with conn.cursor() as cur, cur.copy(binary) as copy:
            copy.set_types(["int8", "vector"])
            for start in range(0, rows, step):
                ids = np.arange(start, min(rows, start + step))
                mixed = base[ids % len(base)] + 0.5 * base[(ids * 7919 + 13) % len(base)]
                mixed += rng.normal(0, 0.02, mixed.shape).astype(np.float32)
                mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
                for i, v in zip(ids.tolist(), mixed, strict=True):
                    copy.write_row((i, v))
        conn.execute(f"COPY reviews TO '{_copy_file(home, rows)}'")
        conn.execute("VACUUM ANALYZE reviews")
        conn.execute("VACUUM ANALYZE vectors")
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                sql.Identifier(name + "_building"), sql.Identifier(name)
            )
        )
    return name, time.perf_counter() - started


def _copy_file(home: Path, rows: int) -> Path:
    folder = home / "copy"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o777)  # the embedded server's own OS user writes it
    return folder / f"reviews_{rows}.copy"


def _work_copy(server_url: str, source: str) -> str:
    name = f"{source}_work"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(source)
            )
        )
    return with_database(server_url, name)


def _drop(server_url: str, url: str) -> None:
    name = url.split("/")[-1].split("?")[0]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# --- one size ------------------------------------------------------------------------------


def _measure_size(server_url: str, home: Path, rows: int, base: np.ndarray) -> Size:
    print(f"scale: {rows:,} rows", flush=True)
    source, build_s = _source(server_url, home, rows, base)
    url = _work_copy(server_url, source)
    result = Size(rows, build_s)
    try:
        with db.connection(url) as conn:
            _capture(conn, home, result)
            _model_add(conn, url, result)
            _claims(conn, url, result)
            _index(conn, result)
    finally:
        _drop(server_url, url)
    return result


def _capture(conn: psycopg.Connection, home: Path, result: Size) -> None:
    """The same bulk load into an unwatched table and a watched one (a model on it)."""
    path = _copy_file(home, result.rows)
    times: dict[str, list[float]] = {"insert": [], "copy": []}
    for watched in (False, True):
        for how in ("insert", "copy"):
            conn.execute("DROP TABLE IF EXISTS bulk")
            conn.execute("DELETE FROM pgembed.inbox")
            conn.execute("CREATE TABLE bulk (id bigint PRIMARY KEY, body text NOT NULL)")
            if watched:
                models.add(conn, models.AddRequest("bulk", "bulk", "body", precision="fp32"))
            conn.execute("CHECKPOINT")
            started = time.perf_counter()
            if how == "insert":
                conn.execute("INSERT INTO bulk (id, body) SELECT id, body FROM reviews")
            else:
                conn.execute(f"COPY bulk (id, body) FROM '{path}'")
            times[how].append(time.perf_counter() - started)
            if watched:
                models.remove(conn, "bulk")
    conn.execute("DROP TABLE IF EXISTS bulk")
    conn.execute("DELETE FROM pgembed.inbox")
    result.insert_select = (times["insert"][0], times["insert"][1])
    result.copy = (times["copy"][0], times["copy"][1])


def _model_add(conn: psycopg.Connection, url: str, result: Size) -> None:
    """`model add` on the full table while an application inserts a row every 20 ms."""
    waits: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        with db.connection(url) as app:
            key = result.rows + 1_000_000
            while not stop.is_set():
                started = time.perf_counter()
                app.execute("INSERT INTO reviews (id, body) VALUES (%s, 'a new review')", [key])
                waits.append(time.perf_counter() - started)
                key += 1
                stop.wait(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(1.0)
    started = time.perf_counter()
    models.add(conn, models.AddRequest("scale", "reviews", "body", precision="fp32"))
    result.model_add_s = time.perf_counter() - started
    time.sleep(1.0)
    stop.set()
    thread.join()
    result.writer_max_ms = max(waits) * 1000
    result.writer_p50_ms = statistics.median(waits) * 1000
    result.writes = len(waits)


def _claims(conn: psycopg.Connection, url: str, result: Size) -> None:
    """The first claim on the fresh backlog, then claims and completions as a worker makes them
    (the queue drained, without embedding), status on the backlog, and the queue's size."""
    result.queue_mb["backlog"] = _queue_mb(conn)
    for exact in (False, True):
        started = time.perf_counter()
        report = status.all_status(conn, exact)
        elapsed = (time.perf_counter() - started) * 1000
        if exact:
            result.status_exact_ms = elapsed
        else:
            result.status_ms, result.status_counts = elapsed, report[0]["counts"]
    plan = claim_plan(conn, "scale", CLAIM)
    result.claim_plan = ", ".join(
        line.strip(" ->").split(" on ")[0] for line in plan if "Scan" in line
    )
    with db.connection(url) as worker:
        times = []
        while True:
            started = time.perf_counter()
            claims = store.claim(worker, "scale", "bench", CLAIM, 60)
            times.append(time.perf_counter() - started)
            if not claims:
                break
            store.complete(worker, "scale", claims)
            store.transfer(worker, "scale")
    result.first_claim_ms = times[0] * 1000
    result.claim_p50_ms = statistics.median(times) * 1000
    result.queue_mb["drained"] = _queue_mb(conn)
    result.queue_mb["autovacuum"] = _after_autovacuum(conn)


def _queue_mb(conn: psycopg.Connection) -> float:
    row = conn.execute("SELECT pg_total_relation_size('pgembed.queue')").fetchone()
    return (row[0] if row else 0) / 1e6


def _after_autovacuum(conn: psycopg.Connection, wait_s: float = 100.0) -> float:
    """The queue's size once autovacuum has been through it after the drain (at most `wait_s`;
    then VACUUM, which does what autovacuum would, and the figure says so)."""
    since = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT last_autovacuum FROM pg_stat_user_tables "
            "WHERE schemaname = 'pgembed' AND relname = 'queue'"
        ).fetchone()
        if row and row[0] and row[0] > since:
            return _queue_mb(conn)
        time.sleep(5)
    conn.execute("VACUUM pgembed.queue")
    return -_queue_mb(conn)  # negative: after a VACUUM by hand


def _index(conn: psycopg.Connection, result: Size) -> None:
    """pgembed's HNSW index (m 16, ef_construction 64, cosine) over the size's vectors, with a
    maintenance_work_mem that holds the graph (about 2.5 kB a row here); the backend's peak
    resident memory from /proc."""
    megabytes = max(64, int(result.rows * 2.5 / 1000 * 1.2))
    result.maintenance_work_mem = f"{megabytes}MB"
    conn.execute(f"SET maintenance_work_mem = '{megabytes}MB'")
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], _rss_mb(pid))

    thread = threading.Thread(target=sample)
    thread.start()
    started = time.perf_counter()
    try:
        conn.execute(
            "CREATE INDEX vectors_hnsw ON vectors USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        )
    finally:
        done.set()
        thread.join()
    result.index_s = time.perf_counter() - started
    result.index_memory_mb = max(peak[0], _peak_mb(pid))
    row = conn.execute("SELECT pg_relation_size('vectors_hnsw')").fetchone()
    result.index_mb = (row[0] if row else 0) / 1e6


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1000
    except OSError:
        pass
    return 0.0


def _peak_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1000
    except OSError:
        pass
    return 0.0


# --- sync workers, with the real model on real reviews ---------------------------------------


def _sync_workers(server_url: str, home: Path) -> tuple[np.ndarray, list[Workers]]:
    """1, 2 and 4 `pgembed sync --once` processes on BASE real reviews; the vectors they wrote
    are the base of every size's vectors (kept in --scale-home)."""
    url = _work_copy_of_new(server_url, "pgembed_scale_sync")
    results = []
    try:
        with db.connection(url) as conn:
            conn.execute("CREATE TABLE real (id bigint PRIMARY KEY, body text NOT NULL)")
            with conn.cursor() as cur, cur.copy("COPY real (id, body) FROM STDIN") as copy:
                for i, text in enumerate(_texts(BASE)):
                    copy.write_row((i, text))
            models.add(conn, models.AddRequest("real", "real", "body", precision="bf16"))
            for n in WORKERS:
                if n != WORKERS[0]:  # a vector cleared by hand queues its row again
                    conn.execute("UPDATE real SET embedding_real = NULL")
                conn.execute("DELETE FROM pgembed.batches")
                results.append(_run_workers(conn, url, n))
                print(f"scale: {n} sync workers: {results[-1].rows_per_s:.1f} rows/s", flush=True)
            vectors = conn.execute("SELECT embedding_real FROM real ORDER BY id").fetchall()
        base = np.array([v[0].to_numpy() for v in vectors], dtype=np.float32)
        np.save(home / "base_vectors.npy", base)
    finally:
        _drop(server_url, url)
    return base, results


def _work_copy_of_new(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(server_url, name)
    with db.connection(url) as conn:
        migrate.migrate(conn)
    return url


def _run_workers(conn: psycopg.Connection, url: str, n: int) -> Workers:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "pgembed", "--database-url", url, "sync", "--once"]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(n)
    ]
    for proc in procs:
        proc.wait()
    wall = time.perf_counter() - started
    # rows/s while embedding: the batches' rows over the span from the first batch's start to
    # the last one's end (each process's model load is not in it)
    rows, span = conn.execute(
        "SELECT sum(rows), extract(epoch FROM max(finished_at) "
        "- min(finished_at - make_interval(secs => seconds))) FROM pgembed.batches"
    ).fetchone()  # type: ignore[misc]
    return Workers(n, int(rows or 0), float(rows or 0) / float(span or 1), wall)


# --- the report ----------------------------------------------------------------------------


def report(workers: list[Workers], sizes: list[Size]) -> str:
    lines = [
        "| rows | INSERT ... SELECT: plain / watched (s) | ratio | COPY: plain / watched (s) "
        "| ratio | `model add` (s) | writer's longest wait (ms), p50 | first claim (ms) "
        "| claim p50 (ms) | `status` (ms): default, `--exact` |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in sizes:
        lines.append(
            f"| {s.rows:,} | {s.insert_select[0]:.2f} / {s.insert_select[1]:.2f} | "
            f"{s.insert_select[1] / s.insert_select[0]:.2f} | {s.copy[0]:.2f} / {s.copy[1]:.2f} "
            f"| {s.copy[1] / s.copy[0]:.2f} | {s.model_add_s:.1f} | {s.writer_max_ms:,.0f}, "
            f"{s.writer_p50_ms:.1f} | {s.first_claim_ms:.1f} | {s.claim_p50_ms:.1f} | "
            f"{s.status_ms:.0f} ({s.status_counts}), {s.status_exact_ms:.0f} |"
        )
    lines += [
        "",
        "| rows | queue MB: backlog, drained, after autovacuum | HNSW build (s) | index MB "
        "| backend peak MB (maintenance_work_mem) | claim plan |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in sizes:
        q = s.queue_mb
        after = q.get("autovacuum", 0.0)
        vacuumed = f"{after:.1f}" if after >= 0 else f"{-after:.1f} (VACUUM by hand)"
        lines.append(
            f"| {s.rows:,} | {q.get('backlog', 0):.1f}, {q.get('drained', 0):.1f}, {vacuumed} | "
            f"{s.index_s:.1f} | {s.index_mb:.0f} | {s.index_memory_mb:,.0f} "
            f"({s.maintenance_work_mem}) | {s.claim_plan} |"
        )
    lines += [
        "",
        "| `pgembed sync --once` processes | rows | rows/s while embedding | wall (s) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {w.processes} | {w.rows:,} | {w.rows_per_s:.1f} | {w.wall_s:.1f} |" for w in workers
    ]
    return "\n".join(lines)


def document(
    workers: list[Workers], sizes: list[Size], machine: str, command: str, seconds: float
) -> str:
    built = ", ".join(f"{s.rows:,} in {s.build_s:.0f} s" for s in sizes if s.build_s)
    return "\n".join(
        [
            START,
            "## Scale: 10k, 100k and 1M rows (`python -m bench --only scale`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}; busy (other sessions shared its 2 cores). Rows: IMDb reviews "
            "repeated (a copy number appended); vectors: all-MiniLM-L6-v2's of "
            f"{BASE:,} real reviews, row i's mixing two of them and noise, normalised. "
            f"Datasets built this run: {built or 'none (reused)'}. `model add` is main's (one "
            "transaction; issue 24's point 1 rewrites it), with precision fp32 (no precision "
            "check); the writer inserts a row every 20 ms through it. The claims drain the "
            f"queue {CLAIM} keys at a time without embedding; status is timed in-process on the "
            "full backlog. The HNSW build is pgembed's index definition on a table of the vectors.",
            "",
            report(workers, sizes),
            "",
            END,
        ]
    )
