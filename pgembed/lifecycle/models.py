"""Adding and removing models: validation, catalog row and per-model objects (in the short
steps of setup.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import psycopg

from pgembed import capture, checks, defaults, roles, sqlfiles
from pgembed.catalog import ddl, naming, registry, tables
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, hardware, precision
from pgembed.encode.settings import encoder_settings, settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import indexbuild, options, setup
from pgembed.lifecycle.generated import ModelSettings


@dataclass(frozen=True)
class AddRequest(ModelSettings):
    """`model add`'s request: where, and the model's settings (keyword-only: options.SETTINGS)."""

    name: str
    table: str
    column: str | tuple[str, ...]  # several: embedded together, joined by a newline
    key: str | None = None
    fulltext: bool = False  # also create the GIN index hybrid search needs
    index: bool = True  # False: the HNSW index comes after the rows (see backfill.py)

    def __post_init__(self) -> None:
        checks.text("name", self.name)
        checks.text("table", self.table)
        column_argument(self.column)
        if self.key is not None:
            checks.text("key", self.key)
        checks.flag("fulltext", self.fulltext)
        options.check(self, alter=False)


def column_argument(column: object) -> str | tuple[str, ...]:
    """`add_model`'s column: one name, or a list or tuple of names (embedded together)."""
    if isinstance(column, str):
        return column
    if isinstance(column, list | tuple) and column and all(isinstance(c, str) for c in column):
        return tuple(column)
    raise UsageError(f"column must be a column name or a list of them, not {checks.shown(column)}")


def add(
    conn: psycopg.Connection,
    request: AddRequest,
    on_wait: ddl.OnWait | None = None,
    *,
    url: str | None = None,
    reporter: setup.Reporter | None = None,
    build: indexbuild.BuildSettings | None = None,
) -> tuple[ModelSpec, int]:
    """Register the model and create its objects; returns the spec and how many rows were queued.

    On an autocommit `conn`, in the steps of lifecycle/setup.py, none of which holds the table
    for more than a moment: the catalog step waits for its lock in short attempts
    (`ddl.retrying_locks`, each told to `on_wait`), the index is built concurrently (watched from
    a second session when the `url` is given), the rows are queued in batches. A model whose
    setup was interrupted is finished instead, with the settings it was registered with.
    In a transaction of the caller's, everything happens in that transaction, as before.
    """
    say = reporter or setup.Reporter()
    name = naming.model_name(request.name)
    if conn.autocommit and registry.exists(conn, name) and setup.pending(conn, name):
        spec = registry.get(conn, name)
        unlike = [d.option for d in differences(request, spec)]
        if unlike:
            raise UsageError(
                f"model {name} was not completely set up, with other settings "
                f"({', '.join(unlike)}): run the same `model add` again to finish it, or "
                f"`pgembed model remove {name}` first"
            )
        say.step(f"model {name} was not completely set up: finishing its setup")
        return spec, setup.finish(conn, url, spec, say, build)
    schema, table = naming.parse_table(request.table)
    if schema == "pgembed":
        raise UsageError(f"{schema}.{table} is pgembed's own: a model watches a table of yours")
    columns = text_columns(request.column)
    key = naming.identifier("key column", request.key) if request.key is not None else None
    if registry.exists(conn, name):
        raise UsageError(_exists(conn, name))
    info = tables.watchable(tables.inspect(conn, schema, table))
    for column in columns:
        tables.text_column(info, column)
    key_column = tables.key_column(info, key)
    embedding_column = naming.embedding_column(name)
    if embedding_column in info.columns:
        raise UsageError(f"table {schema}.{table} already has a column {embedding_column!r}")

    # Load the model before touching the database: a reference that can't load changes nothing.
    asked = options.values(request)
    settings = encoder_settings(asked)
    embedder.resolve(request.model_ref)  # a reference that cannot be found: one line, no step
    say.step(f"loading {request.model_ref}")
    model_info = load_checked(settings)
    if request.long_texts == "chunk":
        require_window(settings)
    spec = ModelSpec(
        name=name,
        table_schema=schema,
        table_name=table,
        key_column=key_column,
        key_type=info.columns[key_column],
        text_column=columns[0],
        text_columns=columns,
        embedding_column=embedding_column,
        dimensions=model_info.dimensions,
        **options.recorded(asked, model_info),
    )
    spec = with_precision(conn, registry.keyed(conn, spec), request.precision, say.step)
    if not conn.autocommit:
        return spec, _add_in_transaction(conn, spec, request, on_wait)
    if setup.leftovers(conn, name):  # of a `model remove` interrupted after its catalog step
        setup.forget(conn, name)
    say.step(f"registering model {name}: column {embedding_column} and capture triggers")
    steps = setup.Pending(index=request.index, fulltext=request.fulltext)
    setup.register(conn, spec, steps, version_of=name, on_wait=on_wait or say.waiting)
    return spec, setup.finish(conn, url, spec, say, build)


@dataclass(frozen=True)
class Difference:
    """A setting (or the table, columns, key) a request asks otherwise than a model has."""

    option: str  # as the CLI spells it, without its dashes
    keyword: str  # as Python does
    asked: object
    registered: object


def differences(request: AddRequest, spec: ModelSpec) -> list[Difference]:
    """What `request` asks for that model `spec` was not registered with (a key, a pooling,
    max_seq_length or precision left to its default matches any): the "same model?" rule of an
    interrupted `model add` run again, and of `add_model(exist_ok=True)`."""
    schema, table = naming.parse_table(request.table)
    found = [
        d
        for d in (
            Difference("column", "column", text_columns(request.column), spec.text_columns),
            Difference("key", "key", request.key or spec.key_column, spec.key_column),
        )
        if d.asked != d.registered
    ]
    # The table by its (schema, name) pair: as one dotted string, "a.b".c would equal a."b.c".
    if (schema, table) != (spec.table_schema, spec.table_name):
        found.insert(0, Difference("table", "table", f"{schema}.{table}", spec.qualified_table))
    return found + [
        Difference(s.option.removeprefix("--"), s.api_name, asked, registered)
        for s, asked, registered in options.unlike(request, spec)
    ]


def _add_in_transaction(
    conn: psycopg.Connection, spec: ModelSpec, request: AddRequest, on_wait: ddl.OnWait | None
) -> int:
    """Everything in the caller's transaction: the table stays locked until it commits."""

    def create() -> int:
        ddl.lock_table(conn, spec)
        registry.insert(conn, spec)
        registry.record_version(conn, spec, spec.name, active=True)
        create_objects(conn, spec, index=request.index)
        if request.fulltext:
            ddl.create_fulltext_index(conn, spec)
        return capture.enqueue_existing(conn, spec)

    return ddl.retrying_locks(conn, spec.table_schema, spec.table_name, create, on_wait)


def create_objects(conn: psycopg.Connection, spec: ModelSpec, *, index: bool = True) -> None:
    """The model's column, index (unless `index` is False), chunk table and capture triggers,
    inside the caller's transaction."""
    ddl.create(conn, spec, index=index)
    capture.create_triggers(conn, spec)


def drop_objects(conn: psycopg.Connection, spec: ModelSpec, *, bookkeeping: bool = True) -> None:
    """Remove what still exists of the model's triggers, grants, indexes and column (a dropped
    table took them along), its chunk table and (unless the caller deletes them after its
    transaction, with setup.forget) its bookkeeping; the table's other data is untouched. The
    catalog rows stay: the caller deletes them."""
    table = tables.is_table(conn, spec.table_schema, spec.table_name)
    if table:
        ddl.lock_table(conn, spec)  # the table, then its chunk table (alter-table's order)
    ddl.drop_chunks(conn, spec)  # before the vector column, which its row policy names
    if table:
        roles.revoke_table(conn, spec)
        capture.drop_triggers(conn, spec)
        ddl.drop_objects(conn, spec)
    if bookkeeping:
        ddl.forget(conn, spec)


def text_columns(requested: str | tuple[str, ...]) -> tuple[str, ...]:
    """The validated text columns of a request: one or more, each once."""
    columns = (requested,) if isinstance(requested, str) else tuple(requested)
    if not columns:
        raise UsageError("name the text column to embed (--column)")
    if len(set(columns)) != len(columns):
        raise UsageError(f"a text column is named twice: {', '.join(columns)}")
    return tuple(naming.identifier("column", c) for c in columns)


def load_checked(settings: embedder.Settings) -> embedder.ModelInfo:
    """Load the model (a reference that cannot load raises) and check its max sequence length."""
    info = embedder.get(settings).info
    if info.position_limit is not None and info.max_seq_length > info.position_limit:
        raise UsageError(
            f"max sequence length {info.max_seq_length} exceeds what {settings.model_ref!r} "
            f"can read ({info.position_limit} word pieces)"
        )
    return info


def require_window(settings: embedder.Settings) -> None:
    """A chunked model's windows must hold enough word pieces to mean something."""
    size = embedder.get(settings).window_size
    if size < defaults.MIN_WINDOW:
        raise UsageError(
            f"--long-texts chunk: windows of {size} word pieces (max sequence length less the "
            f"special tokens and document prefix) are too small; at least {defaults.MIN_WINDOW}"
        )


def remove(conn: psycopg.Connection, name: str, on_wait: ddl.OnWait | None = None) -> ModelSpec:
    """Drop what is left of the model (its table or columns may be gone) and its catalog rows in
    one short transaction, then its queue and other bookkeeping in batches (on an autocommit
    `conn`: a million queue entries are not deleted under the table's lock)."""
    spec = registry.get(conn, name)
    shadow = registry.shadow(conn, name)
    ddl.refuse_column_views(conn, spec, f"removing model {name!r}")

    def drop() -> None:
        # Catalog rows first, then the table: the sync write-back's order (no deadlock).
        conn.execute(sqlfiles.get("lifecycle", "lock_model_rows"), {"name": name})
        if tables.is_table(conn, spec.table_schema, spec.table_name):
            ddl.lock_table(conn, spec)
        if shadow is not None:  # a reindex in progress goes with its model
            drop_objects(conn, shadow, bookkeeping=not conn.autocommit)
            registry.delete(conn, shadow.name)
        drop_objects(conn, spec, bookkeeping=not conn.autocommit)
        registry.delete(conn, name)

    ddl.retrying_locks(conn, spec.table_schema, spec.table_name, drop, on_wait)
    if conn.autocommit:
        for gone in (spec, *([shadow] if shadow is not None else [])):
            setup.forget(conn, gone.name)
    return spec


def add_fulltext_index(
    conn: psycopg.Connection,
    name: str,
    *,
    url: str | None = None,
    on_wait: ddl.OnWait | None = None,
) -> ModelSpec:
    """Create the model's full-text index if it is missing, without blocking reads or writes.

    `conn` must be in autocommit mode (CREATE INDEX CONCURRENTLY cannot run in a transaction).
    Given the `url`, a second session tells `on_wait` whose transactions the build waits for.
    """
    spec = registry.get(conn, name)
    tables.watchable(tables.inspect(conn, spec.table_schema, spec.table_name))
    ddl.drop_invalid_fulltext_index(conn, spec)
    if url is None:
        ddl.create_fulltext_index(conn, spec, concurrently=True)
        return spec
    with indexbuild.reporting_waits(url, conn, on_wait):
        ddl.create_fulltext_index(conn, spec, concurrently=True)
    return spec


def precision_for(
    conn: psycopg.Connection, spec: ModelSpec, requested: str, say: precision.Say | None = None
) -> precision.Choice:
    """The precision `requested` resolves to for `spec`'s settings, checked on its table's texts
    (each candidate's check told to `say`)."""
    return precision.choose(
        settings_of(spec, hardware.resolve_device("auto")),
        requested,
        precision.sample_texts(
            conn, spec.table_schema, spec.table_name, naming.text_expression(spec)
        ),
        say,
    )


def with_precision(
    conn: psycopg.Connection, spec: ModelSpec, requested: str, say: precision.Say | None = None
) -> ModelSpec:
    """`spec` with the precision `requested` resolves to for its (possibly new) settings."""
    choice = precision_for(conn, spec, requested, say)
    return replace(
        spec,
        precision=choice.precision,
        precision_requested=choice.requested,
        precision_cosine=choice.cosine,
        precision_note=choice.note,
    )


def alter_precision(conn: psycopg.Connection, name: str, requested: str) -> ModelSpec:
    """Change a live model's precision in place, without a reindex.

    Vectors already written stay: a precision is accepted only if retrieval with its vectors
    agrees with fp32's (precision.MIN_OVERLAP), so old and new vectors answer searches alike.
    Running workers see the change at their next write-back (the catalog row differs), hand
    that batch back and reread the catalog.
    """
    spec = registry.get(conn, name)
    if spec.shadow_of is not None:
        raise UsageError(f"{name!r} is the reindex shadow of {spec.shadow_of!r}: alter that model")
    running = registry.shadow(conn, name)
    if running is not None:  # the switch would replace the precision with the shadow's
        raise UsageError(
            f"model {name!r} has a reindex to version {running.version} in progress: finish it "
            f"(`pgembed reindex {name}`) or abort it before changing the precision"
        )
    altered = with_precision(conn, spec, requested)
    if not registry.set_precision(conn, altered):
        raise UsageError(f"model {name!r} changed while its precision was checked: run it again")
    return altered


def _exists(conn: psycopg.Connection, name: str) -> str:
    """Why `model add NAME` is refused, and what finishes a model an interrupted `model add
    --backfill` left without its index (its setup is done: running it again cannot resume)."""
    if setup.pending(conn, name):  # only here in a transaction: on autocommit add finishes it
        return (
            f"model {name!r} was not completely set up: the same `model add` finishes it, on an "
            f"autocommit connection (as the CLI's), not in a transaction"
        )
    spec = registry.get(conn, name)
    index = ddl.index_valid(conn, spec.table_schema, naming.index_name(spec))
    if tables.exists(conn, spec.table_schema, spec.table_name) and index is not True:
        return (
            f"model {name!r} already exists, without its HNSW index (an interrupted `model add "
            f"--backfill`?): `pgembed sync` embeds its queued rows and `pgembed reindex {name} "
            "--index-only` builds the index"
        )
    return f"model {name!r} already exists: see `pgembed model list`"
