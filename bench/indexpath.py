"""l: the index or an exact scan. Search latency on tables of long-text rows (600 characters,
whose vectors PostgreSQL keeps in TOAST) and of short ones, at several sizes: the HNSW index
forced, an exact scan forced, plain SQL as the planner chooses, and pgembed.search.

Long rows hold real IMDb reviews cut to 600 characters (../shared/data/imdb-reviews, when
present; else generated 600-character texts), short rows generated reviews; both hold the model's
vectors of the first 2,000 long texts (a bigger table adds near copies of them, so that embedding
stays a minute), written directly. Queries: the first 200 characters of other reviews.
"""

from __future__ import annotations

import datetime
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from bench.env import Database, file_corpus, generated_corpus, median
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.lifecycle import models

START, END = "<!-- bench:indexpath:start -->", "<!-- bench:indexpath:end -->"
REVIEWS = Path(__file__).resolve().parents[2] / "shared/data/imdb-reviews/reviews.csv.gz"
LONG = 600
SIZES = {"long": (100, 500, 2_000, 20_000), "short": (100, 500, 2_000)}
EMBEDDED, QUERIES, PASSES, K = 2_000, 40, 2, 10

# Each way of searching on a connection of its own (each plans its statement once), by name.
WAYS = {
    "index": ("SET enable_seqscan = off", "SELECT id FROM {t} ORDER BY {v} <=> %s LIMIT 10"),
    "exact": ("SET enable_indexscan = off", "SELECT id FROM {t} ORDER BY {v} <=> %s LIMIT 10"),
    "plain": (None, "SELECT id FROM {t} ORDER BY {v} <=> %s LIMIT 10"),
    "search": (None, "SELECT key FROM pgembed.search({m}, %s, 10)"),
    "search_k101": (None, "SELECT key FROM pgembed.search({m}, %s, 101)"),
}


@dataclass(frozen=True)
class Table:
    rows: int
    kind: str  # "long" or "short"
    text_chars: int  # median length of the texts
    toasted: bool  # the vectors live in the TOAST table
    plain_plan: str  # what the planner chose for plain SQL
    p50_ms: dict[str, float]  # by way of searching
    search_recall: float  # pgembed.search's top 10 against the exact top 10


def long_texts(n: int) -> tuple[list[str], str]:
    """n texts of 600 characters and where they come from."""
    if REVIEWS.exists():
        texts = [t[:LONG] for t in file_corpus(REVIEWS, 2 * n + 1000) if len(t) >= LONG][:n]
        if len(texts) == n:
            return texts, "IMDb reviews cut to 600 characters"
    sentences = generated_corpus(8 * n, seed=11)
    rng = random.Random(11)
    texts = [" ".join(rng.sample(sentences, 8))[:LONG] for _ in range(n)]
    return texts, "generated 600-character texts"


def _table(conn: psycopg.Connection, name: str) -> ModelSpec:
    create = sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, body text NOT NULL)")
    conn.execute(create.format(sql.Identifier("public", name)))
    return models.add(conn, models.AddRequest(name, f"public.{name}", "body", precision="fp32"))[0]


def _fill(conn: psycopg.Connection, name: str, texts: list[str], vectors: np.ndarray) -> None:
    table = sql.Identifier("public", name)
    copy = sql.SQL("COPY {} (id, body, {}) FROM STDIN (FORMAT BINARY)").format(
        table, sql.Identifier(f"embedding_{name}")
    )
    # As the sync worker flags its writes: a vector a COPY brings is otherwise cleared.
    conn.execute("SET pgembed.writing = on")
    with conn.cursor() as cur, cur.copy(copy) as out:
        out.set_types(["integer", "text", "vector"])
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
            out.write_row((i, text, Vector(vector)))
    conn.execute("RESET pgembed.writing")
    conn.execute("DELETE FROM pgembed.inbox")  # the vectors are already there
    conn.execute("DELETE FROM pgembed.queue")
    conn.commit()
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def _vectors(embedded: np.ndarray, n: int) -> np.ndarray:
    """n vectors: the embedded ones, then near copies of them (cosine ~0.96 to their original)."""
    picks = embedded[np.arange(n) % len(embedded)]
    noise = np.random.default_rng(n).normal(scale=0.015, size=picks.shape).astype(np.float32)
    noise[: len(embedded)] = 0
    vectors = picks + noise
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


def _statement(name: str, way: str) -> sql.Composed:
    text = WAYS[way][1]
    return sql.SQL(text).format(
        t=sql.Identifier("public", name),
        v=sql.Identifier(f"embedding_{name}"),
        m=sql.Literal(name),
    )


def _timed(database: Database, name: str, queries: np.ndarray) -> dict[str, float]:
    """p50 ms of each way; the ways take turns query by query, so drift weighs on each alike."""
    conns = {way: database.connect() for way in WAYS}
    try:
        for way, (setting, _) in WAYS.items():
            conns[way].autocommit = True
            if setting:
                conns[way].execute(setting)
        out: dict[str, list[float]] = {way: [] for way in WAYS}
        for n in range(PASSES + 1):  # the first pass warms up: plans, pages
            for vec in queries:
                for way in WAYS if n % 2 == 0 else reversed(list(WAYS)):
                    started = time.perf_counter()
                    statement = _statement(name, way)
                    conns[way].execute(statement, (Vector(vec),), prepare=True).fetchall()
                    if n:
                        out[way].append((time.perf_counter() - started) * 1000)
        return {way: median(values) for way, values in out.items()}
    finally:
        for conn in conns.values():
            conn.close()


def _recall(conn: psycopg.Connection, name: str, queries: np.ndarray) -> float:
    hits = 0
    for vec in queries:
        found = {int(k) for (k,) in conn.execute(_statement(name, "search"), (Vector(vec),))}
        with conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            exact = {r[0] for r in conn.execute(_statement(name, "exact"), (Vector(vec),))}
        hits += len(found & exact)
    return hits / (K * len(queries))


def _layout(conn: psycopg.Connection, name: str) -> tuple[int, bool, str]:
    """Median text length, whether the vectors are in TOAST, and plain SQL's plan."""
    table = sql.Identifier("public", name)
    # A vector of 384 dimensions takes 1,544 bytes: fewer heap bytes a row, and it is in TOAST.
    row = conn.execute(
        sql.SQL(
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY length(body))::int, "
            "pg_relation_size({n}) < 1544 * count(*) FROM {t}"
        ).format(n=sql.Literal(f"public.{name}"), t=table)
    ).fetchone()
    assert row is not None
    query = Vector(np.ones(384, dtype=np.float32))
    explain = sql.SQL("EXPLAIN {}").format(_statement(name, "plain"))
    first = next(line for (line,) in conn.execute(explain, (query,)) if "Scan" in line)
    return int(row[0]), bool(row[1]), "index" if "Index Scan" in first else "exact"


def measure(database: Database) -> tuple[list[Table], str]:
    texts, source = long_texts(max(SIZES["long"]) + QUERIES)
    texts, asked = texts[:-QUERIES], [t[:200] for t in texts[-QUERIES:]]
    short = generated_corpus(max(SIZES["short"]), seed=3)
    embedded, queries = np.empty(0), np.empty(0)
    tables = []
    for kind, sizes in SIZES.items():
        for rows in sizes:
            name = f"ip_{kind}_{rows}"
            with database.connect() as conn:
                conn.autocommit = True
                spec = _table(conn, name)
                if not embedded.size:  # once, with the first model's settings
                    model = embedder.get(settings_of(spec))
                    embedded = np.asarray(model.encode_documents(texts[:EMBEDDED]))
                    queries = np.asarray(model.encode_queries(asked))
                body = (texts if kind == "long" else short)[:rows]
                _fill(conn, name, body, _vectors(embedded, rows))
                chars, toasted, plan = _layout(conn, name)
                recall = _recall(conn, name, queries)
            p50 = _timed(database, name, queries)
            tables.append(Table(rows, kind, chars, toasted, plan, p50, recall))
            print(f"  {kind} {rows}: {p50}", flush=True)
    return tables, source


def report(tables: list[Table]) -> str:
    lines = [
        "| l. rows x text (vectors) | index, p50 ms | exact scan | plain SQL (its plan) | "
        "`pgembed.search` k=10 | search / faster of the two | k=101 (dynamic path) | "
        "search recall@10 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in tables:
        p = t.p50_ms
        best = min(p["index"], p["exact"])
        where = "TOAST" if t.toasted else "inline"
        lines.append(
            f"| {t.rows:,} x {t.text_chars} chars ({where}) | {p['index']:.2f} | "
            f"{p['exact']:.2f} | "
            f"{p['plain']:.2f} ({t.plain_plan}) | {p['search']:.2f} | {p['search'] / best:.2f} | "
            f"{p['search_k101']:.2f} | {t.search_recall:.3f} |"
        )
    return "\n".join(lines)


def document(
    tables: list[Table], source: str, machine: str, command: str, postgres: object, seconds: float
) -> str:
    return "\n".join(
        [
            START,
            "## The index or an exact scan (`make bench`, or `python -m bench --only indexpath`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}. PostgreSQL {postgres}. Long rows: {source}; short rows: "
            f"generated reviews. Vectors: all-MiniLM-L6-v2's, of the first {EMBEDDED:,} long "
            "texts (the 20,000-row table adds near copies), HNSW m=16, ef_search 40. "
            f"{QUERIES} queries (the start of other reviews) x {PASSES} passes, the five ways "
            "taking turns on connections of their own; p50 in ms. `pgembed.search` scans a "
            "table of fewer than 200 rows exactly and uses the index otherwise; `plain SQL` is "
            "`ORDER BY <=> LIMIT 10` as the planner chooses; k=101 takes the dynamic path "
            "(`_nearest_v1`).",
            "",
            report(tables),
            "",
            END,
        ]
    )
