"""`pgembed reindex`: re-embed online or rebuild the HNSW index, with progress and clean stops."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import click
from tqdm import tqdm

from pgembed import defaults
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.cli.app import App, stopping
from pgembed.cli.options import setting_options
from pgembed.cli.progress import SetupLines, describe_build
from pgembed.encode import hardware
from pgembed.errors import UsageError
from pgembed.lifecycle import backfill, indexbuild, reindex

F = Callable[..., Any]


def fill_options(command: F) -> F:
    """Options of the worker that fills a shadow and of the index build."""
    for option in reversed(
        [
            click.option(
                "--claim-size",
                type=click.IntRange(1, defaults.MAX_CLAIM_SIZE),
                help=f"Keys claimed at once. Default: {defaults.REINDEX_CLAIM_SIZE}.",
            ),
            click.option(
                "--lease-seconds",
                type=click.FloatRange(min=1),
                default=defaults.LEASE_SECONDS,
                show_default=True,
            ),
            click.option(
                "--max-attempts",
                type=click.IntRange(min=1),
                default=defaults.MAX_ATTEMPTS,
                show_default=True,
            ),
            click.option(
                "--device",
                type=click.Choice(hardware.DEVICES),
                default="auto",
                show_default=True,
                help="Where to encode, as `pgembed sync`: auto picks CUDA, then mps, then the CPU.",
            ),
            click.option(
                "--maintenance-work-mem",
                help="maintenance_work_mem for the index build (HNSW builds fastest in memory). "
                "Default: the graph's estimated size, between "
                f"{defaults.MAINTENANCE_WORK_MEM} and {defaults.MAINTENANCE_WORK_MEM_CAP_MB} MB; "
                "a hint says when it does not fit.",
            ),
            click.option(
                "--parallel-workers",
                type=click.IntRange(0, defaults.MAX_PARALLEL_MAINTENANCE_WORKERS),
                default=defaults.PARALLEL_MAINTENANCE_WORKERS,
                show_default=True,
                help="max_parallel_maintenance_workers for the index build.",
            ),
        ]
    ):
        command = option(command)
    return command


# --m and --ef-construction, as `model alter` takes them (lifecycle/options.py).
hnsw_options = setting_options(alter=True, only=("hnsw_m", "hnsw_ef_construction"))


def run_options(kw: dict[str, Any]) -> reindex.Options:
    """The fill and build options of `reindex` and `model alter`; the device is resolved as
    `pgembed sync` and `model add --backfill` resolve it (hardware.resolve_device)."""
    return reindex.Options(
        device=hardware.resolve_device(kw["device"]),
        claim_size=kw["claim_size"] or defaults.REINDEX_CLAIM_SIZE,
        lease_seconds=kw["lease_seconds"],
        max_attempts=kw["max_attempts"],
        build=indexbuild.BuildSettings(kw["maintenance_work_mem"], kw["parallel_workers"]),
    )


@click.command("reindex")
@click.argument("name")
@click.option("--index-only", is_flag=True, help="Rebuild only the HNSW index, concurrently.")
@hnsw_options
@click.option("--abort", is_flag=True, help="Drop a reindex in progress; the live model stays.")
@fill_options
@click.pass_obj
def reindex_cmd(app: App, /, name: str, index_only: bool, abort: bool, **kw: Any) -> None:
    """Re-embed model NAME into a new column and switch searches over with no downtime.

    Resumes a reindex in progress (from `model alter` or an interrupted run) where it stopped.
    """
    hnsw = kw["hnsw_m"] is not None or kw["hnsw_ef_construction"] is not None
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
        options = run_options(kw)  # its device and memory, before a reindex starts or resumes
        indexbuild.check(conn, options.build)
        running = registry.shadow(conn, name)
        if running is not None and hnsw:
            raise UsageError(
                f"model {name!r} has a reindex in progress: --m and --ef-construction apply when "
                "a reindex starts (run it without them to finish, or --abort it)"
            )
        if running is None:
            change = reindex.Change(
                hnsw_m=kw["hnsw_m"], hnsw_ef_construction=kw["hnsw_ef_construction"]
            )
            shadow, queued = reindex.begin(
                conn, name, change if hnsw else None, reporter=SetupLines()
            )
            click.echo(
                f"model {name}: version {shadow.version} ({describe(shadow)}); {queued} queued"
            )
    run_reindex(app, name, options)


def run_reindex(app: App, name: str, options: reindex.Options) -> None:
    with _Bars() as reporter:
        runner = reindex.Reindex(app.url, name, options, reporter)
        spec = _until_done(
            runner.run,
            runner.stop,
            f"reindex of {name} stopped: run `pgembed reindex {name}` to resume",
        )
    click.echo(
        f"model {name}: version {spec.version} ({describe(spec)}) is live in "
        f"{spec.embedding_column}; the previous column and index were dropped"
    )


def run_backfill(app: App, name: str) -> None:
    """`model add --backfill`: the new model's rows, then its index, with progress."""
    device = hardware.resolve_device("auto")
    options = reindex.Options(claim_size=defaults.BACKFILL_CLAIM_SIZE, device=device)
    with _Bars() as reporter:
        runner = backfill.Backfill(app.url, name, options, reporter)
        spec = _until_done(
            runner.run,
            runner.stop,
            f"backfill of {name} stopped; its queued rows wait for `pgembed sync`, and "
            f"`pgembed reindex {name} --index-only` builds its index (searches scan until then)",
            "stopping after the batch in hand, or cancelling the index build",
        )
    with app.connect() as conn:
        done = reindex.progress(conn, spec)
    left = f"; {done.queued} rows still queued for `pgembed sync`" if done.queued else ""
    click.echo(
        f"model {name}: {done.embedded} rows embedded, index {naming.index_name(spec)} built{left}"
    )


def _rebuild_index(app: App, name: str, kw: dict[str, Any]) -> None:
    build = indexbuild.BuildSettings(kw["maintenance_work_mem"], kw["parallel_workers"])
    with app.connect() as conn:
        registry.get(conn, name)  # an unknown model is its one line, before any progress
    with _Bars() as reporter:
        reporter.phase("building index")
        stop = threading.Event()
        spec = _until_done(
            lambda: indexbuild.rebuild(
                app.url,
                name,
                kw["hnsw_m"],
                kw["hnsw_ef_construction"],
                build,
                reporter.index,
                stop,
                reporter.note,
            ),
            stop.set,
            f"index rebuild of {name} stopped; the old index is still in use",
            "stopping: cancelling the index build",
        )
    params = f"m={spec.hnsw_m}, ef_construction={spec.hnsw_ef_construction}"
    click.echo(f"model {name}: index {naming.index_name(spec)} rebuilt with {params}")


def _until_done(
    run: Callable[[], ModelSpec | None],
    stop: Callable[[], None],
    stopped: str,
    stopping_note: str = "stopping after the batch in hand",
) -> ModelSpec:
    """Run until done; Ctrl-C or SIGTERM calls `stop`, and a stopped run exits 130 with a line.
    The batch in hand is finished first (seconds to a minute on a slow CPU), so the first signal
    says so at once; a second one stops there and then (what it had claimed comes back to the
    queue when its lease ends, as after a kill)."""
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            raise KeyboardInterrupt
        click.echo(f"pgembed: {stopping_note} (Ctrl-C again to stop at once)", err=True)
        stop()

    with stopping(on_signal):
        spec = run()
    if spec is None:
        click.echo(f"pgembed: {stopped}", err=True)
        sys.exit(130)
    return spec


def describe(spec: ModelSpec) -> str:
    return (
        f"{spec.model_ref}, {spec.pooling} pooling, {spec.dimensions} dimensions, {spec.precision}"
        + (", long texts in chunks" if spec.chunked else "")
    )


class _Bars(reindex.Reporter):
    """Progress on stderr: a line per phase, and bars when stderr is a terminal."""

    def __init__(self) -> None:
        self._bar: tqdm[Any] | None = None
        self._show = sys.stderr.isatty()
        self._index_phase: str | None = None

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

    def note(self, text: str) -> None:
        click.echo(f"pgembed: {text}", err=True)

    def advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.update(rows)

    def index(self, sample: indexbuild.BuildProgress) -> None:
        if sample.phase != self._index_phase:  # a line per phase, on a terminal or not
            self._index_phase = sample.phase
            click.echo(f"  index build: {describe_build(sample)}", err=True)
        if self._bar is not None:
            self._bar.set_description(sample.phase, refresh=False)
            self.rows(sample.done, sample.total)
