"""Online reindex: a shadow model fills a new column beside the live one, then switches in.

The shadow is an ordinary catalog row (`shadow_of` = the model it replaces) with its own column,
capture triggers and queue, so the existing machinery keeps it current and fills it: this module's
worker, and any `pgembed sync` daemon. Searches keep reading the live column until the switch
commits (see switch.py). Every step can be repeated, so an interrupted reindex resumes where it
stopped: its queue and column persist.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TypeVar

import psycopg

from pgembed import capture, checks, db, defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry, tables, trust
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import encoder_settings, settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import counts, indexbuild, models, options, setup, switch
from pgembed.lifecycle.generated import SettingChanges
from pgembed.sync import store, worker

T = TypeVar("T")
log = logging.getLogger("pgembed.reindex")


@dataclass(frozen=True)
class Change(SettingChanges):
    """What `model alter` asks for (keyword-only: options.SETTINGS); None keeps the current
    value.

    With another checkpoint (`model_ref`), an unset pooling or max sequence length means the new
    checkpoint's own, as with `model add`; an unset precision is the model's requested one,
    checked again.
    """

    def __post_init__(self) -> None:
        options.check(self, alter=True)

    def precision_only(self) -> str | None:
        """The precision asked for, when it is all that changes: no reindex (see
        models.alter_precision); else None."""
        return self.precision if replace(self, precision=None) == Change() else None


def _pick(new: T | None, current: T) -> T:
    return current if new is None else new


def new_version(spec: ModelSpec, change: Change) -> ModelSpec:
    """The shadow that would embed `spec`'s rows with `change` applied (loads the model)."""
    wanted = options.changed(spec, change)
    settings = encoder_settings(wanted)
    info = models.load_checked(settings)  # a reference that cannot load changes nothing
    if wanted["long_texts"] == "chunk":
        models.require_window(settings)
    shadow = naming.shadow_name(spec.name)
    return replace(
        spec,
        name=shadow,
        embedding_column=naming.embedding_column(shadow),
        dimensions=info.dimensions,
        version=spec.version + 1,
        shadow_of=spec.name,
        **options.recorded(wanted, info),
    )


def begin(
    conn: psycopg.Connection,
    name: str,
    change: Change | None,
    *,
    reporter: setup.Reporter | None = None,
) -> tuple[ModelSpec, int]:
    """Register the next version as a shadow and queue every row for it.

    `change` None re-embeds with the current settings. Returns the shadow and the rows queued.
    On an autocommit `conn`, in the short steps of setup.py (a short catalog transaction, then
    the rows queued in batches); an interrupted start is finished by `Reindex.run`.
    """
    say = reporter or setup.Reporter()
    spec = registry.get(conn, name)
    if spec.shadow_of is not None:
        raise UsageError(f"{name!r} is the reindex shadow of {spec.shadow_of!r}: alter that model")
    running = registry.shadow(conn, name)
    if running is not None:
        raise UsageError(
            f"model {name!r} already has a reindex to version {running.version} in progress: "
            f"run `pgembed reindex {name}` to finish it or `pgembed reindex {name} --abort`"
        )
    ddl.refuse_column_views(conn, spec, f"a reindex of {name!r}")
    wanted = change or Change()
    # The precision is checked again for the new settings: a precision that keeps one
    # checkpoint's neighbours may not keep another's.
    embedder.resolve(_pick(wanted.model_ref, spec.model_ref))  # not found: one line, no step
    say.step(f"loading {_pick(wanted.model_ref, spec.model_ref)}")
    shadow = models.with_precision(
        conn,
        new_version(spec, wanted),
        _pick(wanted.precision, spec.precision_requested),
        say.step,
    )
    if change is not None and _unchanged(spec, shadow):
        raise UsageError(
            f"model {name!r} already has these settings (`pgembed reindex {name}` re-embeds anyway)"
        )
    if registry.exists(conn, shadow.name):
        raise UsageError(f"a model named {shadow.name!r} exists: remove it to reindex {name!r}")
    taken = tables.foreign_chunks(conn, spec, own=spec.chunked) if shadow.chunked else None
    if taken is not None:  # before every row is embedded again for a switch that would fail
        raise UsageError(f"model {name!r}: {taken}")

    if conn.autocommit:
        say.step(f"registering version {shadow.version} as {shadow.name}")
        nothing_to_build = setup.Pending(index=False, fulltext=False)  # Filling builds the index
        setup.register(conn, shadow, nothing_to_build, version_of=name, on_wait=say.waiting)
        return shadow, setup.finish(conn, None, shadow, say)

    def start() -> int:  # in the caller's transaction; waits for the table in short attempts
        ddl.lock_table(conn, shadow)
        registry.insert(conn, shadow)
        registry.record_version(conn, shadow, name, active=False)
        ddl.add_column(conn, shadow)
        ddl.create_chunks(conn, shadow)
        capture.create_triggers(conn, shadow)
        return capture.enqueue_existing(conn, shadow)

    return shadow, ddl.retrying_locks(conn, spec.table_schema, spec.table_name, start)


def _unchanged(spec: ModelSpec, shadow: ModelSpec) -> bool:
    """The shadow would make the same vectors (precision as resolved) in the same index."""
    same = all(
        getattr(shadow, s.stored) == getattr(spec, s.stored)
        for s in options.SETTINGS
        if s.recorded != "checked"
    )
    return (
        same and shadow.dimensions == spec.dimensions and settings_of(shadow) == settings_of(spec)
    )


def abort(conn: psycopg.Connection, name: str) -> ModelSpec:
    """Drop the shadow of a reindex in progress; the live model is untouched."""
    registry.get(conn, name)
    shadow = registry.shadow(conn, name)
    if shadow is None:
        raise UsageError(f"model {name!r} has no reindex in progress")

    def drop() -> None:  # waits for the table in short attempts: see ddl.retrying_locks
        models.drop_objects(conn, shadow, bookkeeping=not conn.autocommit)
        registry.delete(conn, shadow.name)
        forget = {"name": name, "version": shadow.version}
        conn.execute(sqlfiles.get("lifecycle", "forget_version"), forget)

    ddl.retrying_locks(conn, shadow.table_schema, shadow.table_name, drop)
    if conn.autocommit:  # its queue, up to every row of the table, in batches
        setup.forget(conn, shadow.name)
    return shadow


@dataclass(frozen=True)
class ShadowProgress:
    """How far a shadow is: rows with a vector, and rows that have text to embed (counted, or
    estimated on a large table: counts.rows), and its keys queued."""

    embedded: int
    total: int
    queued: int
    exact: bool = True


def progress(conn: psycopg.Connection, shadow: ModelSpec, exact: bool = True) -> ShadowProgress:
    rows = counts.rows(conn, shadow, exact)
    queued = store.queued_count(conn, [shadow.name])
    return ShadowProgress(rows.embedded, rows.total, queued, rows.exact)


class Reporter:
    """What a reindex tells its user as it goes; these defaults say nothing."""

    def phase(self, text: str) -> None:
        """A new step starts ("embedding", "building index", "switching")."""

    def rows(self, done: int, total: int) -> None:
        """Rows embedded so far by anyone, of the rows to embed."""

    def advance(self, rows: int) -> None:
        """This process embedded and wrote `rows` more rows."""

    def index(self, sample: indexbuild.BuildProgress) -> None:
        """A sample of the index build's progress."""

    def note(self, text: str) -> None:
        """Something to know: what the index build waits for, a memory hint."""
        log.warning("%s", text)


@dataclass(frozen=True)
class Options:
    claim_size: int = defaults.REINDEX_CLAIM_SIZE
    lease_seconds: float = defaults.LEASE_SECONDS
    max_attempts: int = defaults.MAX_ATTEMPTS
    build: indexbuild.BuildSettings = field(default_factory=indexbuild.BuildSettings)
    device: str = "cpu"  # a resolved device (cpu, cuda or mps) for this process's worker

    def __post_init__(self) -> None:
        # A claim of 0 would never finish, a negative one fail every batch: refused up front.
        checks.integer("claim_size", self.claim_size, 1, defaults.MAX_CLAIM_SIZE)
        checks.number("lease_seconds", self.lease_seconds, 1)
        checks.integer("max_attempts", self.max_attempts, 1)


def cannot_go_on(conn: psycopg.Connection, spec: ModelSpec) -> str | None:
    """Why the fill of `spec` (a reindex's shadow, or a model being backfilled) stops: the
    reindex given up or switched in by another process meanwhile, the model removed, or what
    trust.broken says; else None."""
    if spec.shadow_of is not None:
        now = registry.shadow(conn, spec.shadow_of)
        if now is None or now.version != spec.version:
            return (
                f"the reindex of {spec.shadow_of} to version {spec.version} was given up or "
                "switched in by another process meanwhile: `pgembed status` says where it stands"
            )
        what = f"reindex of {spec.shadow_of}"
        way_out = f"or give it up: `pgembed reindex {spec.shadow_of} --abort`"
    elif not registry.exists(conn, spec.name):
        return f"model {spec.name!r} was removed meanwhile"
    else:
        what = f"backfill of {spec.name}"
        way_out = (
            f"its rows stay queued for `pgembed sync`, and `pgembed reindex {spec.name} "
            "--index-only` builds its index"
        )
    reason = trust.broken(conn, spec)
    return None if reason is None else f"the {what} cannot go on: {reason} ({way_out})"


class Filling:
    """Embed one model's queue with this process's worker, then build its index concurrently:
    what a reindex does for its shadow and `model add --backfill` for a new model."""

    def __init__(
        self, url: str, name: str, options: Options, reporter: Reporter | None = None
    ) -> None:
        self.url = url
        self.name = name
        self.options = options
        self.reporter = reporter or Reporter()
        self.stop_event = threading.Event()
        self._worker: worker.Worker | None = None

    def stop(self) -> None:
        """Finish the batch in hand (or cancel the index build) and return; a rerun resumes."""
        self.stop_event.set()
        if self._worker is not None:
            self._worker.stop()

    def _fill(self, spec: ModelSpec) -> bool:
        """Embed until the model's queue is empty, waiting out other workers' leases."""
        self.reporter.phase("embedding")
        while not self.stop_event.is_set():
            with db.connection(self.url) as conn:
                # This process's worker would skip the model, and this loop wait for ever.
                reason = cannot_go_on(conn, spec)
                if reason is not None:
                    raise UsageError(reason)
                done = progress(conn, spec)
            self.reporter.rows(done.embedded, done.embedded + done.queued)
            if done.queued == 0:
                return True
            options = worker.Options(
                models=(spec.name,),
                claim_size=self.options.claim_size,
                lease_seconds=self.options.lease_seconds,
                max_attempts=self.options.max_attempts,
                once=True,
                device=self.options.device,
            )
            self._worker = worker.Worker(self.url, options, lambda _m, n: self.reporter.advance(n))
            if self.stop_event.is_set():
                return False
            if self._worker.run().written == 0:
                self._wait_for_leases(spec)
        return False

    def _build_index(self, spec: ModelSpec) -> bool:
        """The model's HNSW index, built concurrently over its filled column; False if stopped."""
        self.reporter.phase("building index")
        return indexbuild.build(
            self.url,
            spec,
            naming.index_name(spec),
            self.options.build,
            self.reporter.index,
            self.stop_event,
            on_wait=self.reporter.note,
            on_note=self.reporter.note,
        )

    def _wait_for_leases(self, spec: ModelSpec) -> None:
        """Keys claimed by another (or a killed) worker, or backing off, come back by themselves."""
        with db.connection(self.url) as conn:
            query = sqlfiles.get("lifecycle", "next_lease_seconds")
            row = conn.execute(query, {"model": spec.name}).fetchone()
        wait = row[0] if row and row[0] is not None else 0.0
        self.stop_event.wait(min(max(wait, 0.1), 5.0))


class Reindex(Filling):
    """Fill a model's shadow, build its index concurrently, fill again, then switch."""

    def run(self) -> ModelSpec | None:
        """The model as switched in, or None when stopped before the switch."""
        with db.connection(self.url) as conn:
            shadow = registry.shadow(conn, self.name)
            if shadow is None:
                raise UsageError(f"model {self.name!r} has no reindex in progress")
            if setup.pending(conn, shadow.name) is not None:  # a start that was interrupted
                self.reporter.phase("queuing")
                setup.finish(conn, None, shadow, setup.Reporter())
        if not self._fill(shadow):
            return None
        built = self._build_index(shadow)
        # Rows changed while the index was built are queued again: embed them before the switch.
        if not built or not self._fill(shadow):
            return None
        self.reporter.phase("switching")
        with db.connection(self.url) as conn:
            return switch.swap_in(conn, self.name)
