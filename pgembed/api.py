"""The public functions: install the schema, register a model, sync once, report status.

They do what `pgembed migrate`, `pgembed model add`, `pgembed sync --once` and
`pgembed status --json` do, through the same internals; `pgembed.Client` and
`pgembed.AsyncClient` offer them as methods. `database_url=None` resolves like the CLI.

(`migrate_schema`, not `migrate`: `pgembed.migrate` is the module that applies the migrations.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg

from pgembed import db, defaults, locate, migrate
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import hardware
from pgembed.errors import UsageError
from pgembed.lifecycle import models as lifecycle
from pgembed.lifecycle import status as lifecycle_status
from pgembed.search import plan
from pgembed.sync import worker


@dataclass(frozen=True)
class SyncResult:
    """What one `sync_once` did: rows whose vectors were written, skipped (their text changed
    meanwhile: queued again), and failed (see `pgembed status`, `pgembed retry`)."""

    written: int
    skipped: int
    failed: int


class ModelOptions(TypedDict, total=False):
    """`add_model`'s keyword arguments, for the clients' methods of that name."""

    key: str | None
    model: str
    pooling: str | None
    normalize: bool
    max_seq_length: int | None
    query_prefix: str
    document_prefix: str
    fulltext: bool
    precision: str
    exist_ok: bool


def migrate_schema(database_url: str | None = None) -> list[str]:
    """Install or upgrade the pgembed schema (`pgembed migrate`): the files applied (migrations,
    then `definitions/...`), empty when it was current."""
    defined: list[migrate.Definition] = []
    with db.connection(locate.resolve_url(database_url)) as conn:
        applied = migrate.migrate(conn, on_define=defined.append)
    return [m.filename for m in applied] + [d.filename for d in defined]


def add_model(
    name: str,
    table: str,
    column: str | Sequence[str],
    *,
    key: str | None = None,
    model: str = defaults.MODEL,
    pooling: str | None = None,
    normalize: bool = True,
    max_seq_length: int | None = None,
    query_prefix: str = "",
    document_prefix: str = "",
    fulltext: bool = False,
    precision: str = "auto",
    exist_ok: bool = False,
    database_url: str | None = None,
) -> ModelSpec:
    """Register model `name` on `table`'s text `column` (or several, embedded together, joined by
    a newline) and queue its rows (`pgembed model add`);
    `sync_once` (or a running `pgembed sync`) embeds them.

    With `exist_ok`, a model of this name that watches the same column with the same settings is
    returned as it is, so an application may call this at every start; one that differs is a
    UsageError (change it with `pgembed model alter`, or pick another name).
    """
    request = lifecycle.AddRequest(
        name=name,
        table=table,
        column=column if isinstance(column, str) else tuple(column),
        key=key,
        model_ref=model,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        query_prefix=query_prefix,
        document_prefix=document_prefix,
        fulltext=fulltext,
        precision=precision,
    )
    with connection(database_url) as conn:
        if exist_ok and registry.exists(conn, name):
            spec = _same_model(registry.get(conn, name), request)
            if fulltext:  # asked for now, perhaps not when it was added: build it if missing
                lifecycle.add_fulltext_index(conn, name)
            return spec
        return lifecycle.add(conn, request)[0]


def _same_model(spec: ModelSpec, request: lifecycle.AddRequest) -> ModelSpec:
    schema, table = naming.parse_table(request.table)
    pairs: list[tuple[str, object, object]] = [  # (setting, asked for, registered); None: any
        ("table", f"{schema}.{table}", spec.qualified_table),
        ("column", lifecycle.text_columns(request.column), spec.text_columns),
        ("key", request.key, spec.key_column),
        ("model", request.model_ref, spec.model_ref),
        ("pooling", request.pooling, spec.pooling),
        ("normalize", request.normalize, spec.normalize),
        ("max_seq_length", request.max_seq_length, spec.max_seq_length),
        ("query_prefix", request.query_prefix, spec.query_prefix),
        ("document_prefix", request.document_prefix, spec.document_prefix),
        # auto asks for nothing in particular: any precision the model was checked in is fine
        (
            "precision",
            None if request.precision == "auto" else request.precision,
            spec.precision_requested,
        ),
    ]
    differ = [
        f"{name} {have!r}, not {want!r}" for name, want, have in pairs if want not in (None, have)
    ]
    if differ:
        raise UsageError(
            f"model {spec.name!r} already exists with {'; '.join(differ)}: pick another name, or "
            "change it with `pgembed model alter`"
        )
    return spec


def sync_once(
    models: str | Sequence[str] | None = None, database_url: str | None = None
) -> SyncResult:
    """Embed every queued row of these models (default: all) and return (`pgembed sync --once`).

    The model loads and encodes in this thread, on every core (or a CUDA GPU when one is
    visible); a web application runs it in a worker thread, or leaves syncing to the
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
