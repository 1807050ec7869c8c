"""CLI commands for a model's lifecycle and quality: alter, reindex, eval, tune, load.

Registered on the main group by cli.py; the work happens in reindex.py, indexbuild.py,
evaluate.py, tune.py and loader.py.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from tqdm import tqdm

from pgembed import loader
from pgembed.catalog import ddl, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.cli.progress import progress_bar
from pgembed.encode import precision
from pgembed.errors import UsageError
from pgembed.lifecycle import indexbuild, models, reindex
from pgembed.search import evaluate, tune

if TYPE_CHECKING:
    from pgembed.cli.main import App

F = Callable[..., Any]


def _fill_options(command: F) -> F:
    """Options of the worker that fills a shadow and of the index build."""
    for option in reversed(
        [
            click.option(
                "--batch-size", type=click.IntRange(1, 10_000), default=64, show_default=True
            ),
            click.option(
                "--lease-seconds", type=click.FloatRange(min=1), default=60.0, show_default=True
            ),
            click.option(
                "--max-attempts", type=click.IntRange(min=1), default=5, show_default=True
            ),
            click.option(
                "--maintenance-work-mem",
                default="1GB",
                show_default=True,
                help="maintenance_work_mem for the index build (HNSW builds fastest in memory).",
            ),
            click.option(
                "--parallel-workers",
                type=click.IntRange(0, 64),
                default=2,
                show_default=True,
                help="max_parallel_maintenance_workers for the index build.",
            ),
        ]
    ):
        command = option(command)
    return command


def _hnsw_options(command: F) -> F:
    command = click.option(
        "--ef-construction", type=click.IntRange(4, 1000), help="HNSW ef_construction."
    )(command)
    return click.option("--m", "m", type=click.IntRange(2, 100), help="HNSW m (links per node).")(
        command
    )


def _run_options(kw: dict[str, Any]) -> reindex.Options:
    return reindex.Options(
        batch_size=kw["batch_size"],
        lease_seconds=kw["lease_seconds"],
        max_attempts=kw["max_attempts"],
        build=indexbuild.BuildSettings(kw["maintenance_work_mem"], kw["parallel_workers"]),
    )


@click.command("alter")
@click.argument("name")
@click.option(
    "--model", "model_ref", help="Another checkpoint: a known name, a local directory or a hub id."
)
@click.option("--pooling", type=click.Choice(registry.POOLINGS), help="mean, cls or max.")
@click.option(
    "--max-seq-length", type=click.IntRange(min=1), help="Truncate texts to this many word pieces."
)
@click.option("--normalize/--no-normalize", default=None, help="L2-normalise vectors (or not).")
@click.option("--query-prefix", help="Text put before every query.")
@click.option("--document-prefix", help="Text put before every embedded row.")
@click.option(
    "--precision",
    "precision_",
    type=click.Choice(precision.REQUESTS),
    help="auto, fp32, bf16 or int8; checked against fp32. Alone it changes no vector: no reindex.",
)
@_hnsw_options
@click.option(
    "--no-wait", is_flag=True, help="Only register the new version; `pgembed reindex` finishes it."
)
@_fill_options
@click.pass_obj
def model_alter(app: App, /, name: str, no_wait: bool, **kw: Any) -> None:
    """Record new settings as the next version of model NAME and reindex online into them."""
    change = reindex.Change(
        model_ref=kw["model_ref"],
        pooling=kw["pooling"],
        normalize=kw["normalize"],
        max_seq_length=kw["max_seq_length"],
        query_prefix=kw["query_prefix"],
        document_prefix=kw["document_prefix"],
        hnsw_m=kw["m"],
        hnsw_ef_construction=kw["ef_construction"],
        precision=kw["precision_"],
    )
    with app.connect() as conn:
        if change.precision_only():
            spec = models.alter_precision(conn, name, kw["precision_"])
            click.echo(f"model {name}: precision {spec.precision}: {spec.precision_note}")
            return
        shadow, queued = reindex.begin(conn, name, change)
    click.echo(
        f"model {name}: version {shadow.version} ({_describe(shadow)}) registered as "
        f"{shadow.name}; {queued} rows queued"
    )
    click.echo(f"precision {shadow.precision}: {shadow.precision_note}")
    if not no_wait:
        _run_reindex(app, name, _run_options(kw))


@click.command("reindex")
@click.argument("name")
@click.option("--index-only", is_flag=True, help="Rebuild only the HNSW index, concurrently.")
@_hnsw_options
@click.option("--abort", is_flag=True, help="Drop a reindex in progress; the live model stays.")
@_fill_options
@click.pass_obj
def reindex_cmd(app: App, /, name: str, index_only: bool, abort: bool, **kw: Any) -> None:
    """Re-embed model NAME into a new column and switch searches over with no downtime.

    Resumes a reindex in progress (from `model alter` or an interrupted run) where it stopped.
    """
    hnsw = kw["m"] is not None or kw["ef_construction"] is not None
    if index_only and abort:
        raise UsageError("--abort stops a full reindex; an --index-only rebuild stops with Ctrl-C")
    if index_only:
        _rebuild_index(app, name, kw)
        return
    with app.connect() as conn:
        if abort:
            shadow = reindex.abort(conn, name)
            click.echo(
                f"model {name}: reindex to version {shadow.version} aborted ({shadow.name} dropped)"
            )
            return
        running = registry.shadow(conn, name)
        if running is not None and hnsw:
            raise UsageError(
                f"model {name!r} has a reindex in progress: --m and --ef-construction apply when "
                "a reindex starts (run it without them to finish, or --abort it)"
            )
        if running is None:
            change = reindex.Change(hnsw_m=kw["m"], hnsw_ef_construction=kw["ef_construction"])
            shadow, queued = reindex.begin(conn, name, change if hnsw else None)
            click.echo(
                f"model {name}: version {shadow.version} ({_describe(shadow)}); {queued} queued"
            )
    _run_reindex(app, name, _run_options(kw))


def _run_reindex(app: App, name: str, options: reindex.Options) -> None:
    with _Bars() as reporter:
        runner = reindex.Reindex(app.url, name, options, reporter)
        with _stopping(runner.stop):
            spec = runner.run()
    if spec is None:
        click.echo(
            f"pgembed: reindex of {name} stopped: run `pgembed reindex {name}` to resume", err=True
        )
        sys.exit(130)
    click.echo(
        f"model {name}: version {spec.version} ({_describe(spec)}) is live in "
        f"{spec.embedding_column}; the previous column and index were dropped"
    )


def _rebuild_index(app: App, name: str, kw: dict[str, Any]) -> None:
    options = _run_options(kw)
    with _Bars() as reporter:
        reporter.phase("building index")
        stop = threading.Event()
        with _stopping(stop.set):
            spec = indexbuild.rebuild(
                app.url, name, kw["m"], kw["ef_construction"], options.build, reporter.index, stop
            )
    if spec is None:
        click.echo(
            f"pgembed: index rebuild of {name} stopped; the old index is still in use", err=True
        )
        sys.exit(130)
    params = f"m={spec.hnsw_m}, ef_construction={spec.hnsw_ef_construction}"
    click.echo(f"model {name}: index {ddl.index_name(spec)} rebuilt with {params}")


def _describe(spec: ModelSpec) -> str:
    return (
        f"{spec.model_ref}, {spec.pooling} pooling, {spec.dimensions} dimensions, {spec.precision}"
    )


@contextmanager
def _stopping(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT/SIGTERM ask for a clean stop (a rerun resumes); the old handlers come back after."""

    def handler(_signum: int, _frame: object) -> None:
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Bars(reindex.Reporter):
    """Progress on stderr: a line per phase, and bars when stderr is a terminal."""

    def __init__(self) -> None:
        self._bar: tqdm[Any] | None = None
        self._show = sys.stderr.isatty()

    def __enter__(self) -> _Bars:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def phase(self, text: str) -> None:
        self._close()
        click.echo(f"{text}…", err=True)
        unit = "rows" if text == "embedding" else "blocks"
        self._bar = tqdm(desc=text, unit=unit, disable=not self._show, leave=True)

    def rows(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = done
            self._bar.refresh()

    def advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.update(rows)

    def index(self, sample: indexbuild.Progress) -> None:
        if self._bar is not None:
            self._bar.set_description(sample.phase, refresh=False)
            self.rows(sample.done, sample.total)


def reindex_line(name: str, info: dict[str, Any]) -> str:
    """The `pgembed status` line of a reindex in progress."""
    index = "index built" if info["index_built"] else "index not built yet"
    return (
        f"  reindex to version {info['version']} in progress ({info['model']}, {info['pooling']}, "
        f"{info['dimensions']}d): embedded {info['rows_embedded']}/{info['rows_total']}  "
        f"queued {info['queued']}  {index}  (`pgembed reindex {name}` finishes it)"
    )


@click.command("eval")
@click.argument("name")
@click.option(
    "--queries",
    "queries_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="BEIR queries: JSON lines with `_id` and `text`.",
)
@click.option(
    "--qrels",
    "qrels_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="BEIR qrels: TSV `query-id, corpus-id, score` with a header.",
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def eval_cmd(
    app: App, name: str, queries_path: Path, qrels_path: Path, k: int, as_json: bool
) -> None:
    """nDCG@k, recall@k and MRR@k of model NAME, exact and through its index."""
    queries = evaluate.read_queries(queries_path)
    qrels = evaluate.read_qrels(qrels_path)
    with app.connect() as conn:
        result = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k)
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2))
        return
    click.echo(f"{name}: {result.queries} queries with qrels, k={k}")
    if result.skipped_queries or result.missing_documents:
        click.echo(
            f"  ({result.skipped_queries} qrels queries without text skipped; "
            f"{result.missing_documents} judged documents are not rows of the table)"
        )
    click.echo(f"  {'':<28}{'nDCG@' + str(k):>10}{'recall@' + str(k):>11}{'MRR@' + str(k):>9}")
    index = f"indexed (ef_search {result.ef_search})" + ("" if result.index_used else " [no index]")
    for label, m in (("exact", result.exact), (index, result.indexed)):
        click.echo(f"  {label:<28}{m.ndcg:>10.4f}{m.recall:>11.4f}{m.mrr:>9.4f}")
    click.echo(f"  index recall@{k} against exact search: {result.index_recall:.4f}")


@click.command("tune")
@click.argument("name")
@click.option(
    "--target-recall", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True
)
@click.option(
    "--queries",
    "queries_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Query texts (BEIR JSON lines). Default: stored vectors as queries.",
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="At most this many queries.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tune_cmd(
    app: App,
    name: str,
    target_recall: float,
    queries_path: Path | None,
    k: int,
    sample: int,
    as_json: bool,
) -> None:
    """Find the smallest ef_search meeting the target recall@k and make it NAME's default."""
    texts = list(evaluate.read_queries(queries_path).values()) if queries_path else []
    with app.connect() as conn:
        result = tune.tune(conn, registry.get(conn, name), target_recall, k, texts, sample)
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2))
        return
    for step in result.steps:
        click.echo(f"  ef_search {step.ef_search:>4}: recall@{k} {step.recall:.4f}")
    verdict = "meets" if result.reached else "is the best available but misses"
    click.echo(
        f"model {name}: ef_search {result.ef_search} recorded (recall@{k} {result.recall:.4f} on "
        f"{result.sample} queries {verdict} the target {result.target})"
    )


@click.command("load")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--table", required=True, help="The table to create or fill ([schema.]table).")
@click.option("--key", help="Key column (primary key of a new table). Default: `_id`, else `id`.")
@click.option(
    "--text-columns", help="Join these fields with a space into the --into column, e.g. title,text."
)
@click.option(
    "--into", default="text", show_default=True, help="The column that receives --text-columns."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "jsonl", "csv"]),
    default="auto",
    show_default=True,
)
@click.pass_obj
def load_cmd(
    app: App, path: Path, table: str, key: str | None, text_columns: str | None, into: str, fmt: str
) -> None:
    """Create or fill a table from JSON lines or CSV (gzip allowed); existing keys are skipped."""
    request = loader.LoadRequest(
        path=path,
        table=table,
        key=key,
        text_columns=tuple(c.strip() for c in text_columns.split(",")) if text_columns else (),
        into=into,
        format=fmt,
    )
    with app.connect() as conn, progress_bar(None, "loading") as advance:
        result = loader.load(conn, request, advance)
    click.echo(
        f"{'created' if result.created else 'filled'} {result.table}: {result.read} records read, "
        f"{result.inserted} inserted, {result.skipped} skipped (key already there)"
    )


COMMANDS = (reindex_cmd, eval_cmd, tune_cmd, load_cmd)
