"""Markdown for BENCHMARKS.md: every figure next to its target, measured in the same run."""

from __future__ import annotations

import argparse
import datetime
import re
from pathlib import Path

from bench.bigrow import BigRow
from bench.capture import Capture
from bench.engines import Row as EngineRow
from bench.latency import Latency
from bench.search import Search
from bench.serve import COLD_RUNS, Serve
from bench.throughput import Throughput

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
# i and j have a generated section of their own, so `--only serve` updates them alone.
SERVE_START, SERVE_END = "<!-- bench:serve:start -->", "<!-- bench:serve:end -->"
BIGROW_START, BIGROW_END = "<!-- bench:bigrow:start -->", "<!-- bench:bigrow:end -->"
ENGINES_START, ENGINES_END = "<!-- bench:engines:start -->", "<!-- bench:engines:end -->"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def throughput(t: Throughput) -> str:
    ba, bc = t.sync_rows_per_s / t.naive_rows_per_s, t.sync_rows_per_s / t.encode_rows_per_s
    ba_indexed = t.sync_rows_per_s / t.naive_indexed_rows_per_s
    bc_unindexed = t.sync_unindexed_rows_per_s / t.encode_rows_per_s
    backfill_a = t.backfill_rows_per_s / t.naive_rows_per_s
    backfill_c = t.backfill_rows_per_s / t.encode_rows_per_s
    d = t.sync_rows_per_s / t.ceiling_rows_per_s
    return "\n".join(
        [
            "| | rows/s (median) | ratio | target |",
            "| --- | ---: | ---: | --- |",
            f"| a. hand-written: SentenceTransformer fp32 encode + executemany UPDATE | "
            f"{t.naive_rows_per_s:.1f} | | |",
            f"| a'. the same, the column carrying an HNSW index (as pgembed's does), "
            "empty at each repeat | "
            f"{t.naive_indexed_rows_per_s:.1f} | b/a' = {ba_indexed:.2f} | (context) |",
            f"| b. `pgembed sync --once` end to end ({t.precision}), a backfill: the index "
            f"empty at each repeat | {t.sync_rows_per_s:.1f} | "
            f"b/a = {ba:.2f} | >= 1.7: {_verdict(ba >= 1.7)} |",
            f"| b'. the same without the model's HNSW index | "
            f"{t.sync_unindexed_rows_per_s:.1f} | b'/c = {bc_unindexed:.2f} | (context) |",
            f"| b''. `model add --backfill`: the rows without the index, then the index built "
            f"over them (timed) | {t.backfill_rows_per_s:.1f} | b''/a = {backfill_a:.2f}, "
            f"b''/c = {backfill_c:.2f} | (context) |",
            f"| c. pgembed's bare encode, same settings | {t.encode_rows_per_s:.1f} | "
            f"b/c = {bc:.2f} | >= 0.9: {_verdict(bc >= 0.9)} |",
            f"| d. FLOP ceiling: {t.peak_gflops:.0f} GFLOP/s measured ({t.precision} matmul) / "
            f"(21.2 MFLOP x {t.mean_tokens:.1f} real tokens) | {t.ceiling_rows_per_s:.1f} | "
            f"d = b/ceiling = {d:.2f} | >= 0.5: {_verdict(d >= 0.5)} |",
            f"| best possible b/a: ceiling / a | | {t.ceiling_rows_per_s / t.naive_rows_per_s:.2f} "
            "| (context) |",
            *_gpu_rows(t),
        ]
    )


def _gpu_rows(t: Throughput) -> list[str]:
    """b and c with --device cuda, when the run had a GPU."""
    if t.gpu_sync_rows_per_s is None or t.gpu_encode_rows_per_s is None:
        return []
    return [
        f"| b (GPU). `pgembed sync --once --device cuda` | {t.gpu_sync_rows_per_s:.1f} | "
        f"b/a = {t.gpu_sync_rows_per_s / t.naive_rows_per_s:.2f} | (context) |",
        f"| c (GPU). bare encode on the GPU | {t.gpu_encode_rows_per_s:.1f} | "
        f"b/c = {t.gpu_sync_rows_per_s / t.gpu_encode_rows_per_s:.2f} | (context) |",
    ]


def capture(results: list[Capture]) -> str:
    lines = [
        "| e. bulk load of rows | without triggers (s) | with triggers (s) | ratio | "
        "target <= 1.5 |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for c in results:
        lines.append(
            f"| {c.method}, {c.rows:,} rows | {c.without_s:.2f} | {c.with_s:.2f} | "
            f"{c.ratio:.2f} | {_verdict(c.ratio <= 1.5)} |"
        )
    return "\n".join(lines)


def latency(insert: Latency, update: Latency) -> str:
    return "\n".join(
        [
            "| | samples | p50 ms | p95 ms | p99 ms | target |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
            f"| f. INSERT committed -> vector written (idle daemon) | {insert.samples} | "
            f"{insert.p50_ms:.0f} | {insert.p95_ms:.0f} | {insert.p99_ms:.0f} | p95 <= 1000: "
            f"{_verdict(insert.p95_ms <= 1000)} |",
            f"| h. application UPDATE of a row whose batch is in flight | {update.samples} | "
            f"{update.p50_ms:.1f} | {update.p95_ms:.1f} | {update.p99_ms:.1f} | p99 <= 50: "
            f"{_verdict(update.p99_ms <= 50)} |",
        ]
    )


def search(s: Search) -> str:
    helper = (
        f"{s.helper_p50_ms:.2f} | {s.helper_p95_ms:.2f} | "
        f"p50 ratio {s.helper_p50_ms / s.raw_p50_ms:.2f} (<= 1.2: "
        f"{_verdict(s.helper_p50_ms / s.raw_p50_ms <= 1.2)})"
        if s.helper_p50_ms is not None and s.helper_p95_ms is not None
        else "n/a | n/a | the SQL helpers are not installed"
    )
    return "\n".join(
        [
            f"| g. search, {s.rows:,} rows, {s.queries} queries x {s.passes} passes "
            "(taking turns), k=10 | p50 ms | p95 ms | note |",
            "| --- | ---: | ---: | --- |",
            f"| raw `ORDER BY embedding <=> q LIMIT 10` | {s.raw_p50_ms:.2f} | "
            f"{s.raw_p95_ms:.2f} | |",
            f"| `pgembed.search(...)` | {helper} |",
            f"| recall@10 of the HNSW index vs exact search | {s.recall_at_10:.3f} | | "
            "default ef_search 40 |",
        ]
    )


def serve(s: Serve) -> str:
    ratio = s.cold_s * 1000 / s.warm_ms
    return "\n".join(
        [
            f"| i, j. `pgembed query` cold and `pgembed serve` warm (model precision "
            f"{s.precision}) | value | ratio | target |",
            "| --- | ---: | ---: | --- |",
            f"| i. cold `pgembed query TEXT -k 10`: a fresh process, wall time, median of "
            f"{COLD_RUNS} texts | {s.cold_s:.2f} s | cold/warm = {ratio:.0f} | <= 3 s: "
            f"{_verdict(s.cold_s <= 3)} |",
            f"| i'. the same, light encoder off (`PGEMBED_LIGHT_ENCODER=0`: sentence-transformers "
            f"imported, as before) | {s.cold_full_s:.2f} s | "
            f"{s.cold_full_s / s.cold_s:.1f}x i | (context) |",
            f"| i''. warm: the same texts, one POST /search each to `pgembed serve`, client-side "
            f"| {s.warm_ms:.1f} ms | | (context) |",
            f"| j. `pgembed serve` POST /search, {s.rows:,} rows, {s.requests} distinct texts, "
            f"k=10, one keep-alive HTTP client: p50 | {s.p50_ms:.1f} ms | | p50 <= 30 ms: "
            f"{_verdict(s.p50_ms <= 30)} |",
            f"| j. the same: p95 | {s.p95_ms:.1f} ms | | (context) |",
            f"| j. the same: the server's own `took_ms`, p50 (embed + search) | "
            f"{s.server_p50_ms:.1f} ms | | (context) |",
        ]
    )


def bigrow(b: BigRow) -> str:
    lines = [
        "| k. `pgembed sync --once`, a fresh process | longest text | rows written "
        "(marked truncated) | wall s | peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for run in (b.normal, b.huge):
        lines.append(
            f"| {run.what} | {run.longest_bytes:,} bytes | {run.written} of {run.rows} "
            f"({run.truncated}) | {run.seconds:.1f} | {run.peak_rss_mb:.0f} |"
        )
    lines.append(
        f"| huge / ordinary peak RSS | | | | {b.ratio:.2f} (bounded: "
        f"{_verdict(b.huge.peak_rss_mb - b.normal.peak_rss_mb < 100)}) |"
    )
    return "\n".join(lines)


def engines(rows: list[EngineRow]) -> str:
    lines = [
        "| m. precision / engine | ran as | rows/s (median) | x torch fp32 | top-10 overlap "
        "with fp32 | mean cosine | gate (overlap >= 0.95) | SciFact nDCG@10 (fp32 0.64508) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in rows:
        ndcg = "-" if r.ndcg is None else f"{r.ndcg:.5f} ({r.ndcg - 0.64508:+.5f})"
        gate = "passes" if r.overlap >= 0.95 else "**fails**"
        lines.append(
            f"| {r.precision} | {r.engine} | {r.rows_per_s:.1f} | {r.speedup:.2f} | "
            f"{r.overlap:.4f} | {r.cosine:.5f} | {gate} | {ndcg} |"
        )
    return "\n".join(lines)


def engines_document(
    results: dict[str, object], machine: str, command: str, seconds: float
) -> str | None:
    """The generated section of m, or None when it did not run."""
    rows = results.get("engines")
    if not isinstance(rows, list):
        return None
    return "\n".join(
        [
            ENGINES_START,
            "## Precisions and engines (`python -m bench --only engines`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}. pgembed's own encoder at each precision on the benchmark's "
            "texts (bare encode, batches of 32 sorted by length); overlap and cosine against "
            "torch fp32 on the same texts, as the quality gate measures them; SciFact: exact "
            "search over the 5,183 abstracts, 300 test queries.",
            "",
            engines(rows),
            "",
            ENGINES_END,
        ]
    )


def bigrow_document(
    results: dict[str, object], machine: str, command: str, seconds: float
) -> str | None:
    """The generated section of k, or None when it did not run."""
    b = results.get("bigrow")
    if not isinstance(b, BigRow):
        return None
    return "\n".join(
        [
            BIGROW_START,
            "## One huge row (`python -m bench --only bigrow`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}. PostgreSQL {results.get('postgres')}. Peak RSS is the sync "
            "process's own (its VmHWM at exit), model load included. The huge row is 100 MB of "
            "md5 hex words made by the server; the daemon reads its first "
            "`CHARS_PER_WORD_PIECE x max_seq_length` characters and its md5 (bounded: the huge "
            "row adds less than 100 MB).",
            "",
            bigrow(b),
            "",
            BIGROW_END,
        ]
    )


def serve_document(
    results: dict[str, object], machine: str, command: str, seconds: float
) -> str | None:
    """The generated section of i and j, or None when they did not run."""
    s = results.get("serve")
    if not isinstance(s, Serve):
        return None
    return "\n".join(
        [
            SERVE_START,
            "## Cold start and the warm path (`make bench`, or `python -m bench --only serve`)",
            "",
            f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
            f"Machine: {machine}. PostgreSQL {results.get('postgres')}. 1-minute load average "
            f"when the cold runs started: {s.load_average:.2f} (the machine is idle near 0). "
            f"The {s.rows:,}-row table holds random unit vectors written directly; each query "
            "text is embedded by the model in the serving process.",
            "",
            serve(s),
            "",
            SERVE_END,
        ]
    )


def document(
    results: dict[str, object],
    machine: str,
    command: str,
    args: argparse.Namespace,
    seconds: float,
) -> str:
    corpus = str(args.corpus) if args.corpus else "generated review-like texts (~48 tokens)"
    parts = [
        START,
        "## Throughput, capture, latency and search (`make bench`)",
        "",
        f"Run {datetime.date.today().isoformat()} in {seconds / 60:.1f} min: `{command}`. "
        f"Machine: {machine}. PostgreSQL {results.get('postgres')}. Corpus: {corpus}, "
        f"{args.rows:,} texts; medians of {args.repeats} repeats; ratios from this same run.",
        "",
    ]
    if isinstance(results.get("throughput"), Throughput):
        parts += [throughput(results["throughput"]), ""]  # type: ignore[arg-type]
    if isinstance(results.get("capture"), list):
        parts += [capture(results["capture"]), ""]  # type: ignore[arg-type]
    if isinstance(results.get("latency_insert"), Latency):
        parts += [latency(results["latency_insert"], results["latency_update"]), ""]  # type: ignore[arg-type]
    if isinstance(results.get("search"), Search):
        parts += [search(results["search"]), ""]  # type: ignore[arg-type]
    parts.append(END)
    return "\n".join(parts)


def write(path: Path, section: str, start: str = START, end: str = END) -> None:
    """Replace a generated section of BENCHMARKS.md, keeping everything written by hand."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    elif start != START and END in text:  # a section of its own goes after the main one
        text = text.replace(END, END + "\n\n" + section, 1)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
