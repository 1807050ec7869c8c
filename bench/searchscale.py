"""Search at scale: recall@10 against an exact scan, and latency, of `pgembed.search` and of raw
SQL on tables of 10k, 100k and 1M rows, with no filter and with filters matching about 30 %, 1 %
and 0.1 % of the rows; and the HNSW index's build time.

Vectors: real ones as far as the corpus goes. Every review but the last 50 is cut into passages
of whole sentences of up to 300 characters (280,416 passages of 49,950 reviews, median 240
characters), embedded once with the default model (cached in `<cache>/searchscale-passages.npz`):
the 10k and 100k tables hold only real passages, in corpus order. The 1M table adds 719,584 rows
that are each normalize(a + 0.5 b + noise): a and b two real passages at random, noise Gaussian
of norm about 0.6 (a row's cosine to its `a` is about 0.8), so each passage has about 2.6 noisy
mixes around it. (An earlier version mixed only 10,000 reviews, about 100 noisy copies around
each: half of a query's top 10 at 1M were copies of one review, ranks 10 and 50 0.021 apart in
cosine, against 0.042 among real reviews; BENCHMARKS.md keeps its figures as a stress case.)
Queries: the first 200 characters of the 50 held-out reviews, embedded as queries. Filter column
`cat`: uniform in 0..999, independent of the text (the hardest case for an index walk), with a
B-tree index, as a user would have: `{"cat": {"$lt": 300}}` (30 %), `{"cat": {"$lt": 10}}`
(1 %), `{"cat": 7}` (0.1 %). `--scale-sweep` also measures raw SQL on the largest table at each
`hnsw.ef_search` given: the recall and latency the default effort trades.

Then, on each table, `pgembed tune --allow-below-default` (target 0.95, two walks) with other query
texts: up to 4 runs of 150 to 200 characters of each held-out review, past the benchmark's query
(`tuning_texts`); and the unfiltered `pgembed.search` measured again with what it recorded. Each
run first forgets an earlier run's tuning, so the defaults are measured as a new user has them.

Building the 1M table and its index takes long on a busy machine, so the tables live in a
database `pgembed_searchscale_passages` that is kept: given a server that outlives the run
(`--database-url`, e.g. a `pgembed db start` server in its own PGEMBED_HOME), a second run only
measures (`--scale-build-only` builds and stops).
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.env import file_corpus, median, percentile
from pgembed import db, defaults, migrate
from pgembed.catalog import ddl, naming, registry
from pgembed.encode import embedder, hardware
from pgembed.lifecycle import models
from pgembed.search import tune

START, END = "<!-- bench:searchscale:start -->", "<!-- bench:searchscale:end -->"
# _passages: the tables of real passages and ef_construction 200; a kept database of the earlier
# tables (10,000 reviews and noisy copies, ef_construction 64) is not taken for them.
DATABASE = "pgembed_searchscale_passages"
QUERIES, K, PASSAGE = 50, 10, 300
PASSES = 4  # of the untuned and the tuned search, in turn
SIZES = (10_000, 100_000, 1_000_000)
FILTERS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "30 %": {"cat": {"$lt": 300}},
    "1 %": {"cat": {"$lt": 10}},
    "0.1 %": {"cat": 7},
}
# The same conditions in SQL (a constant of the benchmark, not user input).
WHERE = {"none": "", "30 %": "AND cat < 300", "1 %": "AND cat < 10", "0.1 %": "AND cat = 7"}


def name(rows: int) -> str:
    return f"scale_{rows // 1000}k" if rows < 1_000_000 else f"scale_{rows // 1_000_000}m"


def database_url(server_url: str) -> str:
    """The kept database on this server, made (and migrated to this pgembed) if needed."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    url = psycopg.conninfo.make_conninfo(server_url, dbname=DATABASE)
    with db.connection(url) as conn:
        migrate.migrate(conn)
    return url


def passages(text: str) -> list[str]:
    """A review cut into passages of whole sentences, each up to ~PASSAGE characters (a longer
    sentence is cut), as a chunked model or a user splitting long texts would store them."""
    out: list[str] = []
    current = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        for piece in (sentence[i : i + PASSAGE] for i in range(0, len(sentence), PASSAGE)):
            if current and len(current) + 1 + len(piece) > PASSAGE:
                out.append(current)
                current = piece
            else:
                current = f"{current} {piece}".strip()
    if current:
        # A short tail joins the passage before it rather than stand alone as a fragment.
        if out and len(current) < PASSAGE // 4:
            out[-1] = f"{out[-1]} {current}"
        else:
            out.append(current)
    return out


def vectors(corpus: Path, cache: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """The real passages' and the queries' vectors, and the precision that embedded them
    (embedded once, then read from the cache)."""
    path = cache / "searchscale-passages.npz"
    if path.exists():
        saved = np.load(path)
        # A cache from before the precision was saved was embedded in bf16.
        precision = str(saved["precision"]) if "precision" in saved.files else "bf16"
        return saved["documents"], saved["queries"], precision
    reviews = file_corpus(corpus, 10**9)
    held_out, kept = reviews[-QUERIES:], reviews[:-QUERIES]
    texts = [p for review in kept for p in passages(review)]
    # bf16 where the CPU has it natively (what `precision auto` stores there, at twice fp32's
    # speed); elsewhere emulated bf16 is slower than fp32, and the vectors agree either way.
    precision = "bf16" if hardware.cpu_has_native_bf16() else "fp32"
    encoder = embedder.get(embedder.Settings(model_ref=defaults.MODEL, precision=precision))
    started = time.monotonic()
    blocks = []
    for at in range(0, len(texts), 10_000):
        blocks.append(encoder.encode_documents(texts[at : at + 10_000]))
        print(
            f"searchscale: embedded {at + len(blocks[-1])} of {len(texts)} passages "
            f"in {time.monotonic() - started:.0f} s",
            flush=True,
        )
    queries = encoder.encode_queries([t[:200] for t in held_out])
    cache.mkdir(parents=True, exist_ok=True)
    documents = np.concatenate(blocks)
    np.savez(path, documents=documents, queries=queries, precision=np.array(precision))
    return documents, queries, precision


def rows(n: int, real: np.ndarray, seed: int = 23) -> Iterator[np.ndarray]:
    """n vectors in blocks: the real ones first, then noisy mixes of them (module docstring)."""
    yield real[:n]
    rng = np.random.default_rng(seed)
    made = min(n, len(real))
    while made < n:
        size = min(50_000, n - made)
        a = real[rng.integers(0, len(real), size)]
        b = real[rng.integers(0, len(real), size)]
        noise = rng.normal(0, 0.6 / np.sqrt(real.shape[1]), size=a.shape).astype(np.float32)
        mixed = a + 0.5 * b + noise
        yield mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
        made += size


@dataclass
class Built:
    rows: int
    index_seconds: float


def build(url: str, rows_wanted: int, real: np.ndarray) -> Built:
    """The table scale_<n> with its model, vectors, `cat` index and HNSW index (kept once built)."""
    table = name(rows_wanted)
    with db.connection(url) as conn:
        conn.autocommit = True
        conn.execute(
            "CREATE TABLE IF NOT EXISTS searchscale_built "
            "(name text PRIMARY KEY, rows bigint, index_seconds float8)"
        )
        done = conn.execute(
            "SELECT rows, index_seconds FROM searchscale_built WHERE name = %s", (table,)
        ).fetchone()
        if done is not None:
            return Built(done[0], done[1])
        if registry.exists(conn, table):
            models.remove(conn, table)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id integer PRIMARY KEY, cat integer NOT NULL, body text NOT NULL)"
            ).format(sql.Identifier(table))
        )
        spec = models.add(
            conn, models.AddRequest(table, table, "body", precision="fp32", index=False)
        )[0]
        register_vector(conn)
        rng = np.random.default_rng(7)
        started = time.monotonic()
        # Written as the sync worker would have: the capture triggers would queue every row.
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(naming.table(spec)))
        copy_sql = sql.SQL("COPY {} (id, cat, body, {}) FROM STDIN (FORMAT BINARY)").format(
            naming.table(spec), sql.Identifier(spec.embedding_column)
        )
        key = 0
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            copy.set_types(["integer", "integer", "text", "vector"])
            for block in rows(rows_wanted, real):
                for vector, cat in zip(block, rng.integers(0, 1000, len(block)), strict=True):
                    copy.write_row((key, int(cat), f"row {key}", Vector(vector)))
                    key += 1
        conn.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER USER").format(naming.table(spec)))
        print(f"searchscale: {table}: {key} rows in {time.monotonic() - started:.0f} s", flush=True)
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} (cat)").format(
                sql.Identifier(f"{table}_cat"), naming.table(spec)
            )
        )
        conn.execute("SET maintenance_work_mem = '4GB'")
        started = time.monotonic()
        ddl.create_index(conn, spec)
        seconds = time.monotonic() - started
        print(f"searchscale: {table}: HNSW index in {seconds:.0f} s", flush=True)
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(naming.table(spec)))
        conn.execute(
            "INSERT INTO searchscale_built VALUES (%s, %s, %s)", (table, rows_wanted, seconds)
        )
        return Built(rows_wanted, seconds)


@dataclass
class Way:
    """One way of searching, on one table and filter: per-query latency, recall and hits."""

    ms: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    ordered: list[bool] = field(default_factory=list)

    def add(self, started: float, found: list[Any], best: list[int]) -> None:
        """One search begun at perf_counter `started`: its (key, similarity) rows, and the
        exact top keys it is judged against (of min(K, matching) rows)."""
        self.ms.append((time.perf_counter() - started) * 1000)
        want = min(K, len(best))
        self.recall.append(len({row[0] for row in found} & set(best)) / want if want else 1.0)
        self.hits.append(len(found))
        sims = [row[1] for row in found]
        self.ordered.append(sims == sorted(sims, reverse=True))

    def summary(self) -> dict[str, float]:
        return {
            "p50": median(self.ms),
            "p95": percentile(self.ms, 95),
            "recall": float(np.mean(self.recall)),
            "worst": float(np.min(self.recall)),
            "mean": float(np.mean(self.ms)),
            "hits": float(np.mean(self.hits)),
            "ordered": float(np.mean(self.ordered)),
        }


def exact(conn: psycopg.Connection, table: str, column: str, where: str, q: Vector) -> list[int]:
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")  # no HNSW; a bitmap scan of `cat` stays
        # Never prepared: a generic plan made here (index scans off) would serve the raw SQL
        # of the same text later (psycopg prepares a statement run 5 times).
        found = conn.execute(_raw(table, column, where), (q, q), prepare=False).fetchall()
    return [row[0] for row in found]


def _raw(table: str, column: str, where: str) -> sql.Composed:
    return sql.SQL(
        "SELECT id, 1 - ({v} OPERATOR(public.<=>) %s) FROM {t} WHERE {v} IS NOT NULL {w} "
        "ORDER BY {v} OPERATOR(public.<=>) %s LIMIT 10"
    ).format(v=sql.Identifier(column), t=sql.Identifier(table), w=sql.SQL(where))  # type: ignore[arg-type]


def tuning_texts(held_out: list[str]) -> list[str]:
    """Up to 4 runs of 150 to 200 characters from each held-out review, past the benchmark's
    query, each from a sentence start, at least 200 characters apart."""
    texts = []
    for review in held_out:
        starts = [m.end() for m in re.finditer(r"[.!?]\s+", review) if m.end() > 200]
        last, picked = -200, 0
        for start in starts:
            if start - last >= 200 and len(review) - start >= 150 and picked < 4:
                texts.append(review[start : start + 200])
                last, picked = start, picked + 1
    return texts


def measure(
    url: str, table: str, queries: np.ndarray
) -> tuple[dict[str, dict[str, dict[str, float]]], list[list[int]]]:
    """Every filter: pgembed.search, raw SQL (pgvector's defaults) and the docs' recipe; and
    the exact top 10 without a filter, which the tuned search and the sweep are judged by."""
    with db.connection(url) as conn:
        register_vector(conn)
        spec = registry.get(conn, table)
        tune.record(conn, table, None, None)  # the defaults, whatever an earlier run tuned
        column = spec.embedding_column
        warm(conn, table, column, queries)
        results: dict[str, dict[str, dict[str, float]]] = {}
        truths: dict[str, list[list[int]]] = {}
        for label, filter in FILTERS.items():
            where = WHERE[label]
            ways = {"search": Way(), "raw": Way(), "recipe": Way()}
            qs = [Vector(q) for q in queries]
            truth = truths[label] = [exact(conn, table, column, where, q) for q in qs]
            for q in qs[:5]:  # warm the caches
                _way(conn, "search", table, column, filter, where, q)
            for q, best in zip(qs, truth, strict=True):
                for way, timed in ways.items():
                    started = time.perf_counter()
                    timed.add(started, _way(conn, way, table, column, filter, where, q), best)
            results[label] = {way: w.summary() for way, w in ways.items()}
            print(f"searchscale: {table} {label}: {results[label]}", flush=True)
        return results, truths["none"]


def warm(conn: psycopg.Connection, table: str, column: str, queries: np.ndarray) -> None:
    """Every query walked once at ef_search 1000: the index pages any later walk of them reads
    are in memory, for the defaults' measurement as for the tuned one's (which follows tune's
    many walks)."""
    with conn.transaction():
        conn.execute("SET LOCAL hnsw.ef_search = 1000")
        for q in queries:
            conn.execute(_raw(table, column, ""), (Vector(q), Vector(q))).fetchall()


def tuned(
    url: str, table: str, queries: np.ndarray, texts: list[str], truth: list[list[int]]
) -> dict[str, Any]:
    """`pgembed tune` on `texts`; then the unfiltered pgembed.search untuned and tuned in turn,
    PASSES passes each (the catalog switched between them), judged by `truth` (measure's): the
    medians of the passes' figures, and in each pass the tuned p50 over the untuned one."""
    with db.connection(url) as conn:
        register_vector(conn)
        spec = registry.get(conn, table)
        started = time.monotonic()
        tuning = tune.tune(
            conn, spec, queries=texts, allow_below_default=True, source="tuning_texts"
        )
        seconds = time.monotonic() - started
        qs = [Vector(q) for q in queries]
        settings = {"untuned": (None, None), "tuned": (tuning.ef_search, tuning.two_walks)}
        passes: dict[str, list[dict[str, float]]] = {label: [] for label in settings}
        for _ in range(PASSES):
            for label, (ef_search, pair) in settings.items():
                tune.record(conn, table, ef_search, pair)  # the tuned last: left as tune left it
                passes[label].append(_searched(conn, table, qs, truth))
    result = {
        "tuning": asdict(tuning),
        "seconds": seconds,
        **{label: {k: median([p[k] for p in ps]) for k in ps[0]} for label, ps in passes.items()},
        "ratios": [
            t["p50"] / u["p50"] for u, t in zip(passes["untuned"], passes["tuned"], strict=True)
        ],
    }
    print(f"searchscale: {table} tuned: {result}", flush=True)
    return result


def _searched(
    conn: psycopg.Connection, table: str, qs: list[Vector], truth: list[list[int]]
) -> dict[str, float]:
    """One pass of the unfiltered pgembed.search over every query, after 5 warm-up searches."""
    for q in qs[:5]:
        _way(conn, "search", table, "", None, "", q)
    way = Way()
    for q, best in zip(qs, truth, strict=True):
        started = time.perf_counter()
        way.add(started, _way(conn, "search", table, "", None, "", q), best)
    return way.summary()


def _way(
    conn: psycopg.Connection,
    way: str,
    table: str,
    column: str,
    filter: dict[str, Any] | None,
    where: str,
    q: Vector,
) -> list[Any]:
    """One search's (key, similarity) rows: pgembed.search, raw SQL or the docs' recipe."""
    if way == "search":
        return conn.execute(
            "SELECT key::integer, similarity FROM pgembed.search(%s, %s, 10, %s)",
            (table, q, Jsonb(filter) if filter else None),
        ).fetchall()
    if way == "raw":
        return conn.execute(_raw(table, column, where), (q, q)).fetchall()
    return _recipe(conn, table, column, where, q)


def _recipe(conn: psycopg.Connection, table: str, column: str, where: str, q: Vector) -> list[Any]:
    """docs/search.md's plain-SQL recipe for a filter: an iterative scan, re-sorted."""
    with conn.transaction():
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        conn.execute("SET LOCAL hnsw.ef_search = 200")
        statement = sql.SQL(
            "WITH near AS MATERIALIZED ({raw}) SELECT * FROM near ORDER BY 2 DESC"
        ).format(raw=_raw(table, column, where))
        return conn.execute(statement, (q, q)).fetchall()


def sweep(
    url: str, table: str, queries: np.ndarray, efforts: tuple[int, ...], truth: list[list[int]]
) -> list[dict[str, float]]:
    """Raw SQL's recall@10 and latency at each hnsw.ef_search (strict order, no filter), judged
    by `truth` (measure's): what the default effort trades (_default_ef_v1)."""
    with db.connection(url) as conn:
        register_vector(conn)
        column = registry.get(conn, table).embedding_column
        qs = [Vector(q) for q in queries]
        measured = []
        for ef in efforts:
            conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
            way = Way()
            for q in qs[:5]:  # warm the caches
                conn.execute(_raw(table, column, ""), (q, q)).fetchall()
            for q, best in zip(qs, truth, strict=True):
                started = time.perf_counter()
                way.add(started, conn.execute(_raw(table, column, ""), (q, q)).fetchall(), best)
            measured.append({"ef_search": ef, **way.summary()})
            print(f"searchscale: {table} ef_search {ef}: {measured[-1]}", flush=True)
        conn.execute("RESET hnsw.ef_search")
        return measured


def run(
    server_url: str,
    corpus: Path,
    cache: Path,
    sizes: tuple[int, ...],
    build_only: bool,
    efforts: tuple[int, ...] = (),
) -> dict[str, Any]:
    url = database_url(server_url)
    documents, queries, precision = vectors(corpus, cache)
    built = {name(n): build(url, n, documents) for n in sizes}
    if build_only:
        return {"built": {k: vars(v) for k, v in built.items()}}
    texts = tuning_texts(file_corpus(corpus, 10**9)[-QUERIES:])
    measured, truths = {}, {}
    for table in built:
        measured[table], truths[table] = measure(url, table, queries)
    result: dict[str, Any] = {
        "precision": precision,
        "built": {k: vars(v) for k, v in built.items()},
        "measured": measured,
        "tuned": {t: tuned(url, t, queries, texts, truths[t]) for t in built},
    }
    if efforts:
        largest = name(max(sizes))
        result["sweep"] = {largest: sweep(url, largest, queries, efforts, truths[largest])}
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        "| rows | filter | `pgembed.search` p50 / p95 ms | recall@10 (worst) | raw SQL p50 / p95"
        " ms | recall@10 (worst), hits | recipe p50 ms | recall@10 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for table, filters in result.get("measured", {}).items():
        for label, ways in filters.items():
            s, r, c = ways["search"], ways["raw"], ways["recipe"]
            lines.append(
                f"| {table} | {label} | {s['p50']:.1f} / {s['p95']:.1f} | {s['recall']:.3f}"
                f" ({s['worst']:.1f}) | {r['p50']:.1f} / {r['p95']:.1f} | {r['recall']:.3f}"
                f" ({r['worst']:.1f}), {r['hits']:.1f} | {c['p50']:.1f} | {c['recall']:.3f} |"
            )
    ordered = [
        ways["search"]["ordered"]
        for filters in result.get("measured", {}).values()
        for ways in filters.values()
    ]
    lines.append("")
    if ordered:
        lines.append(
            "`pgembed.search` results best first: "
            f"{sum(o == 1.0 for o in ordered)} of {len(ordered)} (table, filter) pairs, "
            "every query."
        )
    if result.get("tuned"):
        lines += [
            "",
            "Unfiltered, after `pgembed tune --allow-below-default` (target 0.95, 95 % sure) on "
            "the tuning texts (up to 4 other runs of 150-200 characters of each held-out review; "
            f"not the benchmark's queries, but passages of the same reviews); `pgembed.search` "
            f"untuned and tuned in turn, {PASSES} passes each, medians of the passes:",
            "",
            "| rows | recorded | tuning: queries, recall@10 (95 % bound), walking twice | tune s "
            "| untuned p50 / p95 / mean ms, recall@10 | tuned p50 / p95 / mean ms, recall@10 "
            "(worst) | tuned / untuned p50, each pass |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for table, t in result["tuned"].items():
            tuning, u, s = t["tuning"], t["untuned"], t["tuned"]
            pair = tuning["two_walks"]
            if pair:
                recorded = (
                    f"ef_search {tuning['ef_search']}; two walks {pair['first']}, then "
                    f"{pair['second']} past mean distance {pair['distance']:.3f}"
                )
                measured = f"{pair['recall']:.3f} ({pair['lower']:.3f}), {pair['twice']:.0%}"
            else:
                recorded = f"ef_search {tuning['ef_search']}, one walk"
                measured = f"{tuning['recall']:.3f}, 0 %"
            lines.append(
                f"| {table} | {recorded} | {tuning['sample']}, {measured} | {t['seconds']:.0f} "
                f"| {u['p50']:.1f} / {u['p95']:.1f} / {u['mean']:.1f}, {u['recall']:.3f} "
                f"| {s['p50']:.1f} / {s['p95']:.1f} / {s['mean']:.1f}, {s['recall']:.3f} "
                f"({s['worst']:.1f}) | {', '.join(f'{r:.2f}' for r in t['ratios'])} |"
            )
    for table, steps in result.get("sweep", {}).items():
        lines += [
            "",
            f"Raw SQL on {table} by `hnsw.ef_search` (strict order, no filter):",
            "",
            "| ef_search | p50 / p95 ms | recall@10 (worst) |",
            "| --- | --- | --- |",
        ]
        lines += [
            f"| {st['ef_search']} | {st['p50']:.1f} / {st['p95']:.1f} | {st['recall']:.3f}"
            f" ({st['worst']:.1f}) |"
            for st in steps
        ]
        lines.append("")
    lines.append(
        "Index build: "
        + ", ".join(f"{t} {b['index_seconds']:.0f} s" for t, b in result.get("built", {}).items())
    )
    return "\n".join(lines)


def document(result: dict[str, Any], machine: str, command: str, seconds: float) -> str:
    return "\n".join(
        [
            START,
            "## Search at scale (`python -m bench --only searchscale`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"{machine}.",
            "",
            "Tables `scale_10k`, `scale_100k`, `scale_1m` (id, cat, body, the model's vector): "
            "every IMDb review but the last 50 cut into passages of whole sentences of up to 300 "
            "characters (280,416 passages, median 240 characters) embedded by the default model "
            f"({result['precision']}); the 10k and 100k tables hold the first passages only, "
            "real texts; the 1M table all 280,416 and 719,584 rows normalize(a + 0.5 b + noise) "
            "of two of them at random (noise of norm ~0.6). `cat` uniform in 0..999 with a "
            "B-tree index: filters "
            '`{"cat": {"$lt": 300}}` (30 %), `{"cat": {"$lt": 10}}` (1 %), `{"cat": 7}` (0.1 %). '
            "HNSW index: pgembed's defaults (m 16, ef_construction 200). "
            "50 queries: the first 200 characters of the 50 held-out reviews. Recall@10 against "
            "an exact scan of the same filter (of min(10, matching) rows); latency per query from "
            "the client, one connection, after every query walked the index once at ef_search "
            "1000 and 5 warm-up searches. `pgembed.search`: its defaults (then tuned, below). "
            "Raw SQL: `... WHERE filter ORDER BY v <=> q LIMIT 10` with pgvector's defaults "
            "(ef_search 40, no iterative scan). Recipe: docs/search.md's filtered plain SQL "
            "(relaxed iterative scan, ef_search 200, sorted again).",
            "",
            report(result),
            END,
        ]
    )
