"""The public functions: install the schema, register or alter a model, sync once, report status.

They do what `pgembed migrate`, `pgembed model add`, `pgembed model alter`, `pgembed sync --once`
and `pgembed status --json` do, through the same internals, with a keyword for every option of
those commands (tests/unit/test_api_options.py compares them); `pgembed.Client` and
`pgembed.AsyncClient` offer them as methods. `database_url=None` resolves like the CLI.

(`migrate_schema`, not `migrate`: `pgembed.migrate` is the module that applies the migrations.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Unpack

import psycopg

from pgembed import checks, db, defaults, locate, migrate
from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import hardware
from pgembed.errors import PgembedError, UsageError
from pgembed.lifecycle import altertable, indexbuild, options, reindex, setup
from pgembed.lifecycle import backfill as lifecycle_backfill
from pgembed.lifecycle import models as lifecycle
from pgembed.lifecycle import status as lifecycle_status
from pgembed.lifecycle.altertable import Altered
from pgembed.lifecycle.generated import AddKeywords, AlterKeywords
from pgembed.search import plan
from pgembed.sync import worker

log = logging.getLogger("pgembed")


@dataclass(frozen=True)
class SyncResult:
    """What one `sync_once` did: rows whose vectors were written, skipped (their text changed
    meanwhile: queued again), and failed (see `pgembed status`, `pgembed retry`)."""

    written: int
    skipped: int
    failed: int


class ModelOptions(AddKeywords, total=False):
    """`add_model`'s keyword arguments, for the clients' methods of that name: the model's
    settings (AddKeywords, generated from lifecycle/options.py) and these."""

    key: str | None
    fulltext: bool
    backfill: bool
    exist_ok: bool


class AlterOptions(AlterKeywords, total=False):
    """`alter_model`'s keyword arguments, for the clients' methods of that name: the settings to
    change (AlterKeywords, generated from lifecycle/options.py) and these."""

    wait: bool
    claim_size: int
    lease_seconds: float
    max_attempts: int
    device: str
    maintenance_work_mem: str | None
    parallel_workers: int


def migrate_schema(database_url: str | None = None) -> list[str]:
    """Install or upgrade the pgembed schema (`pgembed migrate`): the files applied (migrations,
    then `definitions/...`), empty when it was current."""
    defined: list[migrate.Definition] = []
    with db.connection(locate.resolve_url(database_url)) as conn:
        applied = migrate.migrate(conn, on_define=defined.append)
        for line in setup.guard_older_models(conn):
            log.warning("%s", line)
    return [m.filename for m in applied] + [d.filename for d in defined]


def add_model(
    name: str,
    table: str,
    column: str | Sequence[str],
    *,
    key: str | None = None,
    fulltext: bool = False,
    backfill: bool = False,
    exist_ok: bool = False,
    database_url: str | None = None,
    **settings: Unpack[AddKeywords],
) -> ModelSpec:
    """Register model `name` on `table`'s text `column` (or several, embedded together, joined by
    a newline) and queue its rows (`pgembed model add`);
    `sync_once` (or a running `pgembed sync`) embeds them.

    The model's `settings` are `model add`'s options as keywords (`model`, `pooling`, ...: the
    keys of AddKeywords, with their defaults; what each does: `pgembed model add --help`).
    `long_texts="chunk"` embeds every window of a long text (README: Long texts). With
    `backfill`, the existing rows are embedded in this call, in this thread, then the HNSW index
    is built over them (`model add --backfill`).

    With `exist_ok`, a model of this name that watches the same column with the same settings is
    returned as it is, so an application may call this at every start; one that differs is a
    UsageError (change it with `pgembed model alter`, or pick another name).
    """
    checks.flag("backfill", backfill)
    checks.flag("exist_ok", exist_ok)
    request = lifecycle.AddRequest(
        name,
        table,
        lifecycle.column_argument(column),
        key,
        fulltext=fulltext,
        index=not backfill,
        **options.from_keywords("add_model", settings, alter=False),
    )
    url = locate.resolve_url(database_url)
    with connection(url) as conn:
        # A model whose setup was interrupted is finished by lifecycle.add, exist_ok or not.
        if exist_ok and registry.exists(conn, name) and setup.pending(conn, name) is None:
            spec = _same_model(registry.get(conn, name), request)
            if fulltext:  # asked for now, perhaps not when it was added: build it if missing
                lifecycle.add_fulltext_index(conn, name)
            return spec
        spec = lifecycle.add(conn, request, url=url)[0]
    if backfill:
        fill = reindex.Options(
            claim_size=defaults.BACKFILL_CLAIM_SIZE, device=hardware.resolve_device("auto")
        )
        _finished(lifecycle_backfill.Backfill(url, spec.name, fill).run(), "backfill", name)
    return spec


def _same_model(spec: ModelSpec, request: lifecycle.AddRequest) -> ModelSpec:
    differ = [
        f"{d.keyword} {d.registered!r}, not {d.asked!r}"
        for d in lifecycle.differences(request, spec)
    ]
    if differ:
        raise UsageError(
            f"model {spec.name!r} already exists with {'; '.join(differ)}: pick another name, or "
            "change it with `pgembed model alter`"
        )
    return spec


def alter_model(
    name: str,
    *,
    wait: bool = True,
    claim_size: int = defaults.REINDEX_CLAIM_SIZE,
    lease_seconds: float = defaults.LEASE_SECONDS,
    max_attempts: int = defaults.MAX_ATTEMPTS,
    device: str = "auto",
    maintenance_work_mem: str | None = None,
    parallel_workers: int = defaults.PARALLEL_MAINTENANCE_WORKERS,
    database_url: str | None = None,
    **settings: Unpack[AlterKeywords],
) -> ModelSpec:
    """Record new settings as the next version of model `name` and reindex online into them
    (`pgembed model alter`); a setting not given (or None) is kept. The `settings` are `model
    alter`'s options as keywords (the keys of AlterKeywords; `hnsw_m` and `hnsw_ef_construction`
    for --m and --ef-construction). Returns the model as switched in, or with `wait=False` the
    registered version (its shadow), which `pgembed reindex` or a running `pgembed sync` fills.
    A change of `precision` alone changes no vector: no reindex.

    The reindex embeds in this thread (`claim_size`, `lease_seconds`, `max_attempts`, `device`
    as `pgembed sync`'s) and builds the index with `maintenance_work_mem` (None: sized from the
    table, as `pgembed reindex` does) and `parallel_workers` maintenance workers.
    """
    change = reindex.Change(**options.from_keywords("alter_model", settings, alter=True))
    checks.text("name", name)
    checks.flag("wait", wait)
    build = indexbuild.BuildSettings(maintenance_work_mem, parallel_workers)
    url = locate.resolve_url(database_url)
    with connection(url) as conn:
        if (alone := change.precision_only()) is not None:
            return lifecycle.alter_precision(conn, name, alone)
        fill = None
        if wait:  # the fill's options, checked before the version is registered (not half done)
            fill = reindex.Options(
                claim_size=claim_size,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                build=build,
                device=hardware.resolve_device(device),
            )
            indexbuild.check(conn, build)
        shadow = reindex.begin(conn, name, change)[0]
    if fill is None:
        return shadow
    return _finished(reindex.Reindex(url, name, fill).run(), "reindex", name)


def alter_table(table: str, statement: str, *, database_url: str | None = None) -> Altered:
    """Run `statement` (say a watched column's new type) with the capture triggers of `table`'s
    models dropped before it and made again after it, in one transaction of its own (`pgembed
    alter-table`): the vectors stay, and rows whose text the statement changed are queued."""
    checks.text("table", table)
    checks.text("statement", statement)
    with connection(database_url) as conn:
        return altertable.alter_table(conn, table, statement)


def _finished(spec: ModelSpec | None, what: str, name: str) -> ModelSpec:
    """A fill's result; None only when it was stopped, which nothing here does."""
    if spec is None:
        raise PgembedError(f"the {what} of {name!r} stopped before it finished")
    return spec


def sync_once(
    models: str | Sequence[str] | None = None, database_url: str | None = None
) -> SyncResult:
    """Embed every queued row of these models (default: all) and return (`pgembed sync --once`).

    The model loads and encodes in this thread, on every core (or a GPU when torch sees one:
    CUDA, else Apple's MPS); a web application runs it in a worker thread, or leaves syncing to the
    `pgembed sync` daemon.
    """
    names = (models,) if isinstance(models, str) else tuple(models or ())
    url = locate.resolve_url(database_url)
    device = hardware.resolve_device("auto")
    options = worker.Options(
        models=names, claim_size=defaults.claim_size(device), once=True, device=device
    )
    stats = worker.Worker(url, options).run()
    return SyncResult(stats.written, stats.skipped, stats.failed)


def status(database_url: str | None = None, *, exact: bool = False) -> list[dict[str, Any]]:
    """Per model: rows embedded, backlog, lag, failures, throughput, live workers and a reindex in
    progress; what `pgembed status --json` prints. A table of more than 100,000 rows is
    estimated (`"counts": "estimate"`) unless `exact`."""
    with connection(database_url) as conn:
        return lifecycle_status.all_status(conn, exact)


@contextmanager
def connection(database_url: str | None) -> Iterator[psycopg.Connection]:
    """A connection to a database whose pgembed schema is current (else a SchemaError)."""
    with plan.errors(), db.connection(locate.resolve_url(database_url)) as conn:
        migrate.require_current(conn)
        yield conn
