"""n: long texts truncated or in chunks (`model add --long-texts truncate|chunk`), side by side.

The same model is added twice on the same table, once per mode, and each is synced on its own
(`pgembed sync --once` in this process, the model loaded beforehand). Two corpora:

- SciFact (../shared/data/scifact): `pgembed eval`'s nDCG@10 on the 300 test queries, exact and
  through the index; chunking must not lose more than 0.005.
- IMDb known items (../shared/data/imdb-reviews): 1,500 reviews spread over the file (short
  ones are distractors); for 200 reviews longer than the model's window, a query of 30 words from
  past their first max_seq_length word pieces, which truncation never embeds. hit@10 (the review
  is in the top 10) and MRR@10.

Cost on the same rows: vectors per row, sync rows/s, HNSW index bytes (main + chunks) and the
p50 of `pgembed.search` (k=10, warm, both modes taking turns query by query).
"""

from __future__ import annotations

import csv
import datetime
import gzip
import math
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from bench.env import Database, median, timed
from pgembed import defaults, loader
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import runtime_settings, settings_of
from pgembed.lifecycle import status
from pgembed.search import evaluate
from pgembed.sync import worker

START, END = "<!-- bench:chunking:start -->", "<!-- bench:chunking:end -->"
DATA = Path(__file__).resolve().parents[2] / "shared/data"
SCIFACT = DATA / "scifact"
REVIEWS = DATA / "imdb-reviews/reviews.csv.gz"
MODES = ("truncate", "chunk")
# Pinned, for both modes, so that the comparison is of chunking alone: an int8 engine's vectors
# differ from fp32's by more than chunking's 0.005 gate could see past. bf16 moves them by less
# than 2e-5 (fp32 where the CPU has no bf16).
PRECISION = "bf16"
IMDB_ROWS, KNOWN_ITEMS, SPAN_WORDS, MIN_SPAN_WORDS = 1_500, 200, 30, 20
# The chunking the feature promises: windows of max_seq_length - 2 word pieces, some shared.
OVERLAP, MAX_WINDOWS = defaults.CHUNK_OVERLAP, defaults.MAX_WINDOWS
K, PASSES = 10, 2
SEARCH = "SELECT key::pg_catalog.text FROM pgembed.search(%s, %s, %s)"


@dataclass(frozen=True)
class Mode:
    """One model (one --long-texts mode) on one corpus."""

    name: str
    precision: str
    rows: int
    chunks: int  # rows of its chunk table (windows past each row's first)
    sync_rows_per_s: float
    index_bytes: int  # its HNSW index, plus the chunk table's
    exact: evaluate.Metrics  # `pgembed eval`, exact search
    indexed: evaluate.Metrics  # `pgembed eval`, through the index at the default ef_search
    helper: evaluate.Metrics  # what `pgembed.search(name, q, 10)` returned
    index_recall: float  # `pgembed eval`: the index's top 10 against exact search's
    search_p50_ms: float
    load_average: float  # 1-minute load average when its sync started (idle is near 0)

    @property
    def vectors_per_row(self) -> float:
        return (self.rows + self.chunks) / self.rows


@dataclass(frozen=True)
class Corpus:
    label: str
    rows: int
    long_rows: int  # more than max_seq_length word pieces, special tokens included
    expected_windows: int  # every row's windows by the promised arithmetic (a check)
    queries: int
    first_window_cosine: float  # min over rows: chunk mode's main vector vs truncate's
    modes: dict[str, Mode]


# -- corpora -------------------------------------------------------------------------------


def tokenizer_of(model_ref: str) -> Any:
    """The model's fast tokenizer, with offsets and without truncation or padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(embedder.resolve(model_ref)) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def windows(pieces: int, max_seq_length: int) -> int:
    """Windows of a text of `pieces` word pieces (no special tokens) in chunk mode."""
    window = max_seq_length - 2
    if pieces <= window:
        return 1
    return min(MAX_WINDOWS, 1 + math.ceil((pieces - window) / (window - OVERLAP)))


def _stride(rows: int) -> int:
    return max(1, 50_000 // rows)


def _load_imdb(conn: psycopg.Connection, table: str, n: int) -> dict[str, str]:
    """Every (50,000 / n)th review, line breaks as spaces (as bench.env.file_corpus reads them)."""
    stride = _stride(n)
    texts: dict[str, str] = {}
    with gzip.open(REVIEWS, "rt", encoding="utf-8", newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i % stride == 0 and len(texts) < n:
                texts[row["id"]] = re.sub(r"<br\s*/?>", " ", row["text"])
    create = sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, body text NOT NULL)")
    conn.execute(create.format(sql.Identifier("public", table)))
    copy = sql.SQL("COPY {} (id, body) FROM STDIN").format(sql.Identifier("public", table))
    with conn.cursor() as cur, cur.copy(copy) as out:
        for key, text in texts.items():
            out.write_row((int(key), text))
    return texts


def _load_scifact(conn: psycopg.Connection, table: str, data: Path) -> dict[str, str]:
    """The corpus as `pgembed load` makes it (title and abstract into `text`); its rows."""
    request = loader.LoadRequest(
        data / "corpus.jsonl.gz", table, key="_id", text_columns=("title", "text")
    )
    loader.load(conn, request)
    query = sql.SQL("SELECT _id::pg_catalog.text, text FROM {}")
    return {k: t for k, t in conn.execute(query.format(sql.Identifier("public", table)))}


def known_items(
    texts: dict[str, str], tokenizer: Any, max_seq_length: int, n: int
) -> tuple[dict[str, str], evaluate.Qrels]:
    """Queries of SPAN_WORDS words from past each long review's first max_seq_length pieces."""
    candidates: dict[str, str] = {}
    for key, encoding in zip(texts, tokenizer.encode_batch(list(texts.values())), strict=True):
        if len(encoding.ids) <= max_seq_length:  # nothing past piece max_seq_length
            continue
        past = encoding.offsets[max_seq_length - 1][1]  # the end of word piece max_seq_length
        words = texts[key][past:].split()[1:]  # the first may be the rest of a cut word
        if len(words) >= MIN_SPAN_WORDS:
            candidates[key] = " ".join(words[:SPAN_WORDS])
    chosen = random.Random(12).sample(sorted(candidates, key=int), min(n, len(candidates)))
    return {f"q{key}": candidates[key] for key in chosen}, {f"q{key}": {key: 1} for key in chosen}


# -- one model per mode --------------------------------------------------------------------


def _add(url: str, name: str, table: str, column: str, mode: str) -> None:
    """`pgembed model add`, as a user runs it."""
    command = [sys.executable, "-m", "pgembed", "--database-url", url, "model", "add", name]
    command += ["--table", table, "--column", column, "--long-texts", mode]
    done = subprocess.run(
        [*command, "--precision", PRECISION], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"model add {name} --long-texts {mode}: {done.stderr.strip()}")


def _sync(database: Database, spec: ModelSpec, texts: list[str]) -> tuple[float, float]:
    """Seconds of `pgembed sync --once` of this model alone, its encoder loaded and warm, and
    the load average when it started."""
    embedder.get(runtime_settings(spec)).encode_documents(texts[:64])
    load = os.getloadavg()[0]
    options = worker.Options(models=(spec.name,), once=True)
    seconds = timed(lambda: worker.Worker(database.url, options).run())
    with database.connect() as conn:
        state = status.model_status(conn, spec)
    print(
        f"  {spec.name}: {state['rows_embedded']} of {state['rows_total']} rows, "
        f"{state.get('chunks')} chunks in {seconds:.1f} s (failed {state['failed']}, "
        f"queued {state['queued']}; load average {load:.2f} at the start)",
        flush=True,
    )
    if state["rows_embedded"] != state["rows_total"] or state["queued"]:
        raise RuntimeError(f"sync left rows of {spec.name} unembedded: {state}")
    return seconds, load


def _chunks(conn: psycopg.Connection, spec: ModelSpec) -> int:
    """`status`'s chunk count, checked against the chunk table itself."""
    reported = int(status.model_status(conn, spec).get("chunks") or 0)
    if spec.chunked:
        count = sql.SQL("SELECT pg_catalog.count(*) FROM {}").format(naming.chunk_table(spec))
        row = conn.execute(count).fetchone()
        if row is None or row[0] != reported:
            raise RuntimeError(f"status says {reported} chunks of {spec.name}, the table {row}")
    return reported


def _index_bytes(conn: psycopg.Connection, spec: ModelSpec) -> int:
    row = conn.execute(
        "SELECT COALESCE(pg_catalog.sum(pg_catalog.pg_relation_size(c.oid)), 0)::bigint "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s)",
        (spec.table_schema, [naming.index_name(spec), naming.chunk_index_name(spec)]),
    ).fetchone()
    return int(row[0]) if row else 0


def _first_window_cosine(conn: psycopg.Connection, a: ModelSpec, b: ModelSpec) -> float:
    query = sql.SQL("SELECT pg_catalog.min(1 - ({} <=> {})) FROM {}").format(
        sql.Identifier(a.embedding_column), sql.Identifier(b.embedding_column), naming.table(a)
    )
    row = conn.execute(query).fetchone()
    return float(row[0]) if row and row[0] is not None else math.nan


def _searches(
    database: Database, names: list[str], vectors: np.ndarray
) -> dict[str, tuple[list[float], list[list[str]]]]:
    """Per model: ms of each `pgembed.search` and its keys. After a warm-up pass, PASSES passes;
    the models take turns query by query, each on its own connection, so drift weighs alike."""
    conns = {name: database.connect() for name in names}
    out: dict[str, tuple[list[float], list[list[str]]]] = {n: ([], []) for n in names}
    try:
        for n in range(PASSES + 1):
            for vec in vectors:
                for name in names if n % 2 == 0 else reversed(names):
                    started = time.perf_counter()
                    rows = conns[name].execute(SEARCH, (name, Vector(vec), K), prepare=True)
                    keys = [k for (k,) in rows]
                    if n:
                        out[name][0].append((time.perf_counter() - started) * 1000)
                    if n == PASSES:
                        out[name][1].append(keys)
        return out
    finally:
        for conn in conns.values():
            conn.close()


# -- a corpus ------------------------------------------------------------------------------


def _add_both(database: Database, prefix: str, table: str, column: str) -> dict[str, ModelSpec]:
    """The same model on the same table once per mode, as `pgembed model add` makes it."""
    specs: dict[str, ModelSpec] = {}
    for mode in MODES:
        _add(database.url, f"{prefix}_{mode}", f"public.{table}", column, mode)
        with database.connect() as conn:
            specs[mode] = registry.get(conn, f"{prefix}_{mode}")
    if specs["truncate"].precision != specs["chunk"].precision:
        raise RuntimeError(f"the modes' precisions differ: {specs}")
    return specs


def _compare(
    database: Database,
    specs: dict[str, ModelSpec],
    texts: dict[str, str],
    questions: tuple[dict[str, str], evaluate.Qrels],
    order: tuple[str, ...],
) -> dict[str, Mode]:
    """Sync each mode (in `order`), evaluate it, time its searches."""
    queries, qrels = questions
    body = list(texts.values())
    synced = {mode: _sync(database, specs[mode], body) for mode in order}
    ids = [q for q in qrels if q in queries]
    encoder = embedder.get(settings_of(specs["truncate"]))
    vectors = np.asarray(encoder.encode_queries([queries[q] for q in ids]))
    timings = _searches(database, [specs[m].name for m in MODES], vectors)
    out: dict[str, Mode] = {}
    with database.connect() as conn:
        for mode in MODES:
            spec = registry.get(conn, specs[mode].name)
            found = evaluate.evaluate(conn, spec, queries, qrels, K)
            latencies, rankings = timings[spec.name]
            out[mode] = Mode(
                name=spec.name,
                precision=spec.precision,
                rows=len(texts),
                chunks=_chunks(conn, spec),
                sync_rows_per_s=len(texts) / synced[mode][0],
                index_bytes=_index_bytes(conn, spec),
                exact=found.exact,
                indexed=found.indexed,
                helper=evaluate.score(dict(zip(ids, rankings, strict=True)), qrels, K),
                index_recall=found.index_recall,
                search_p50_ms=median(latencies),
                load_average=synced[mode][1],
            )
    return out


def _corpus(
    label: str,
    texts: dict[str, str],
    specs: dict[str, ModelSpec],
    questions: tuple[dict[str, str], evaluate.Qrels],
    modes: dict[str, Mode],
    database: Database,
) -> Corpus:
    """The corpus's figures, with its long rows and the windows chunk mode should make."""
    spec = specs["chunk"]
    counted = tokenizer_of(spec.model_ref).encode_batch(list(texts.values()))
    pieces = [len(e.ids) for e in counted]
    long_rows = sum(1 for p in pieces if p + 2 > spec.max_seq_length)
    expected = sum(windows(p, spec.max_seq_length) for p in pieces)
    with database.connect() as conn:
        cosine = _first_window_cosine(conn, specs["truncate"], spec)
    print(
        f"{label}: {len(texts)} rows, {long_rows} long, {expected} windows expected, "
        f"{modes['chunk'].rows + modes['chunk'].chunks} vectors made; first windows' min "
        f"cosine to truncate's vectors {cosine:.6f}",
        flush=True,
    )
    queries = sum(1 for q in questions[1] if q in questions[0])
    return Corpus(label, len(texts), long_rows, expected, queries, cosine, modes)


@dataclass(frozen=True)
class _Setup:
    """A corpus loaded, its questions, and its two models added (not yet synced)."""

    label: str
    texts: dict[str, str]
    questions: tuple[dict[str, str], evaluate.Qrels]
    specs: dict[str, ModelSpec]


def scifact(database: Database, data: Path) -> _Setup:
    with database.connect() as conn:
        conn.autocommit = True
        texts = _load_scifact(conn, "chunk_scifact", data)
    questions = (
        evaluate.read_queries(data / "queries.jsonl"),
        evaluate.read_qrels(data / "qrels/test.tsv"),
    )
    specs = _add_both(database, "scifact", "chunk_scifact", "text")
    return _Setup("SciFact", texts, questions, specs)


def imdb(database: Database, rows: int, n_queries: int) -> _Setup:
    with database.connect() as conn:
        conn.autocommit = True
        texts = _load_imdb(conn, "chunk_imdb", rows)
    specs = _add_both(database, "imdb", "chunk_imdb", "body")
    window = specs["chunk"].max_seq_length
    questions = known_items(texts, tokenizer_of(specs["chunk"].model_ref), window, n_queries)
    return _Setup("IMDb", texts, questions, specs)


def _run(database: Database, setup: _Setup, order: tuple[str, ...]) -> Corpus:
    modes = _compare(database, setup.specs, setup.texts, setup.questions, order)
    return _corpus(setup.label, setup.texts, setup.specs, setup.questions, modes, database)


def measure(
    database: Database,
    data: Path = SCIFACT,
    rows: int = IMDB_ROWS,
    queries: int = KNOWN_ITEMS,
) -> list[Corpus]:
    # Every model added first (a few minutes), then synced and searched (the rest).
    setups = [scifact(database, data), imdb(database, rows, queries)]
    # Truncate first on SciFact, chunk first on IMDb: the machine's drift weighs on both.
    return [_run(database, setups[0], MODES), _run(database, setups[1], MODES[::-1])]


# -- BENCHMARKS.md -------------------------------------------------------------------------

_METRICS = (("ndcg", "nDCG@10"), ("recall", "hit@10"), ("mrr", "MRR@10"))
_WAYS = (
    ("exact", "exact (`pgembed eval`)"),
    ("indexed", "through the index (`pgembed eval`, ef_search 40)"),
    ("helper", "`pgembed.search(name, q, 10)`"),
)


def _quality_row(corpus: Corpus, metric: str, label: str, way: str, how: str) -> str:
    truncate, chunk = (getattr(getattr(corpus.modes[m], way), metric) for m in MODES)
    if corpus.label == "SciFact":
        target = f">= -0.005: {_verdict(chunk - truncate >= -0.005)}" if way != "helper" else ""
    else:
        target = f"chunk > truncate: {_verdict(chunk > truncate)}" if way == "exact" else ""
    return (
        f"| {corpus.label} {label}, {how} | {truncate:.4f} | {chunk:.4f} | "
        f"{chunk - truncate:+.4f} | {target or '(context)'} |"
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def quality(corpora: list[Corpus]) -> str:
    lines = [
        "| n. retrieval, k=10 | truncate | chunk | chunk - truncate | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for corpus in corpora:
        metrics = _METRICS[:1] if corpus.label == "SciFact" else _METRICS[1:]
        for metric, label in metrics:
            for way, how in _WAYS:
                lines.append(_quality_row(corpus, metric, label, way, how))
        truncate, chunk = (corpus.modes[m].index_recall for m in MODES)
        lines.append(
            f"| {corpus.label} index recall@10 against exact search (`pgembed eval`) | "
            f"{truncate:.4f} | {chunk:.4f} | {chunk - truncate:+.4f} | (context) |"
        )
    return "\n".join(lines)


def cost(corpora: list[Corpus]) -> str:
    head = " | ".join(f"{c.label} truncate | {c.label} chunk | chunk / truncate" for c in corpora)
    rows: list[tuple[str, Any]] = [
        ("vectors per row (rows + chunk rows) / rows", lambda m: (m.vectors_per_row, "{:.2f}")),
        ("`pgembed sync --once` rows/s", lambda m: (m.sync_rows_per_s, "{:.1f}")),
        ("HNSW index MB (main + chunks)", lambda m: (m.index_bytes / 2**20, "{:.1f}")),
        ("`pgembed.search` k=10, warm: p50 ms", lambda m: (m.search_p50_ms, "{:.2f}")),
    ]
    lines = [
        f"| n. cost | {head} |",
        "| --- |" + " ---: |" * 3 * len(corpora),
        "| rows (longer than the window) | "
        + " | ".join(f"{c.rows:,} ({c.long_rows:,}) | {c.rows:,} | 1.00" for c in corpora)
        + " |",
    ]
    for label, value in rows:
        cells = []
        for corpus in corpora:
            (t, fmt), (c, _) = (value(corpus.modes[m]) for m in MODES)
            cells += [fmt.format(t), fmt.format(c), f"{c / t:.2f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(corpora: list[Corpus]) -> str:
    return quality(corpora) + "\n\n" + cost(corpora)


def document(
    corpora: list[Corpus], machine: str, command: str, postgres: object, seconds: float
) -> str:
    sizes = "; ".join(
        f"{c.label}: {c.rows:,} rows, {c.long_rows:,} longer than the window, "
        f"{c.queries} queries, chunk mode's {c.modes['chunk'].rows + c.modes['chunk'].chunks:,} "
        f"vectors (about {c.expected_windows:,} by the arithmetic above; window starts move to "
        "word starts); its first windows "
        f"against truncate's vectors: min cosine {c.first_window_cosine:.6f}; 1-minute load "
        f"average when the syncs started (truncate, chunk): "
        + ", ".join(f"{c.modes[m].load_average:.2f}" for m in MODES)
        for c in corpora
    )
    precision = corpora[0].modes["truncate"].precision
    return "\n".join(
        [
            START,
            "## Long texts: truncate or chunk (`python -m bench --only chunking`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}. PostgreSQL {postgres}. all-MiniLM-L6-v2 ({precision}, pinned: "
            "the comparison is of chunking alone) added twice on the same table, "
            "`--long-texts truncate` and `--long-texts chunk` (windows "
            f"of max_seq_length - 2 = 254 word pieces, {OVERLAP} shared, at most {MAX_WINDOWS}), "
            "each synced alone with the model loaded. SciFact: the abstracts (title and text), the "
            "test queries, nDCG@10. IMDb known items: one review in "
            f"{_stride(corpora[-1].rows)} of ../shared/data/imdb-reviews (short ones are "
            "distractors); each query is "
            f"{SPAN_WORDS} words from past the first 256 word pieces of a long review, whose "
            "only relevant row is that review (hit@10 = recall@10). Latency: each query once "
            f"to warm up, then {PASSES} passes, the two modes taking turns query by query on "
            f"connections of their own. {sizes}.",
            "",
            report(corpora),
            "",
            END,
        ]
    )
