"""What we need to know about a user's table before watching it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import psycopg

from pgembed import sqlfiles
from pgembed.catalog import naming, registry
from pgembed.errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from pgembed.catalog.registry import ModelSpec

_TEXT_TYPES = {"text", "character varying", "character", "citext"}


@dataclass(frozen=True)
class TableInfo:
    schema: str
    name: str
    columns: dict[str, str]  # column -> format_type()
    primary_key: tuple[str, ...]
    unique_columns: frozenset[str]  # columns with a single-column unique index
    not_null: frozenset[str] = frozenset()
    generated: frozenset[str] = frozenset()  # GENERATED ALWAYS AS (...) columns
    partitioned: bool = False
    partition_of: str | None = None  # the partitioned table this one is a partition of
    children: tuple[str, ...] = ()  # its inheritance children (INHERITS), not partitions
    untrusted: dict[str, str] = field(default_factory=dict)  # column -> type a user owns


def inspect(conn: psycopg.Connection, schema: str, name: str) -> TableInfo:
    row = conn.execute(sqlfiles.get("catalog", "table_oid"), {"schema": schema, "name": name})
    found = row.fetchone()
    if found is None:
        raise _not_a_table(conn, schema, name)
    oid = {"oid": found[0]}
    columns: dict[str, str] = dict(
        conn.execute(sqlfiles.get("catalog", "table_columns"), oid).fetchall()
    )
    indexes = conn.execute(sqlfiles.get("catalog", "table_unique_indexes"), oid).fetchall()
    primary = next((tuple(cols) for is_pk, cols in indexes if is_pk), ())
    unique = frozenset(cols[0] for _, cols in indexes if len(cols) == 1)
    flags = conn.execute(sqlfiles.get("catalog", "table_column_flags"), oid).fetchall()
    return TableInfo(
        schema,
        name,
        columns,
        primary,
        unique,
        not_null=frozenset(column for _, column, not_null, *_ in flags if not_null),
        generated=frozenset(column for _, column, _, generated, *_ in flags if generated),
        partitioned=any(partitioned for partitioned, *_ in flags),
        partition_of=next((parent for *_, parent, _ in flags if parent), None),
        children=tuple(next((children for *_, children in flags if children), ())),
        untrusted=dict(conn.execute(sqlfiles.get("catalog", "untrusted_columns"), oid).fetchall()),
    )


# pg_class.relkind of the relations a model cannot watch, in words.
_KINDS = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "S": "a sequence",
    "i": "an index",
    "I": "an index",
    "c": "a composite type",
    "t": "a TOAST table",
}


def _not_a_table(conn: psycopg.Connection, schema: str, name: str) -> NotFoundError | UsageError:
    """Why schema.name is not a table pgembed can watch: missing, or another kind of relation
    (a model's triggers and vector column live on a table)."""
    row = conn.execute(sqlfiles.get("catalog", "relation_kind"), {"schema": schema, "name": name})
    found = row.fetchone()
    if found is None:
        return NotFoundError(f"table {schema}.{name} does not exist")
    kind = _KINDS.get(str(found[0]), "not a table")
    return UsageError(
        f"{schema}.{name} is {kind}: a model watches a table (name the table it reads)"
    )


def is_table(conn: psycopg.Connection, schema: str, name: str) -> bool:
    """Whether schema.name is a table (plain or partitioned)."""
    row = conn.execute(sqlfiles.get("catalog", "table_oid"), {"schema": schema, "name": name})
    return row.fetchone() is not None


def watchable(info: TableInfo) -> TableInfo:
    """`info`, if pgembed can watch the table: a partitioned one needs per-partition indexes
    and CREATE INDEX CONCURRENTLY (full-text, reindex, alter), which pgembed does not do; a
    partition cannot have a column of its own (the model's vector). A table with inheritance
    children is read with their rows, which its capture triggers do not see."""
    if info.children:
        raise UsageError(inherited(info.schema, info.name, info.children))
    if info.partitioned:
        what = "is partitioned"
    elif info.partition_of:
        what = f"is a partition of {info.partition_of}"
    else:
        return info
    raise UsageError(
        f"table {info.schema}.{info.name} {what}: not supported (pgembed adds its vector column to "
        "the table, which PostgreSQL allows only on a whole partitioned table, and builds its "
        "indexes concurrently, which PostgreSQL refuses on one); embed a plain table of the key "
        "and the text instead: one the application writes beside it, or a copy (`CREATE TABLE t "
        "AS SELECT key, text FROM ...; ALTER TABLE t ADD PRIMARY KEY (key)`)"
    )


def inherited(schema: str, name: str, children: tuple[str, ...]) -> str:
    return (
        f"table {schema}.{name} has inheritance children ({', '.join(children)}): not "
        "supported (every query of it reads their rows too, which its triggers do not capture: "
        "their text changes would keep old vectors); watch each table of its own, or detach them "
        "(`ALTER TABLE child NO INHERIT parent`)"
    )


def exists(conn: psycopg.Connection, schema: str, name: str) -> bool:
    """Whether schema.name is taken by any relation (a table, a view, ...)."""
    query = sqlfiles.get("catalog", "relation_exists")
    row = conn.execute(query, {"schema": schema, "name": name}).fetchone()
    return bool(row and row[0])


def own_chunks(conn: psycopg.Connection, schema: str, name: str) -> bool:
    """Whether schema.name is pgembed's chunk table: a plain table owned by pgembed's catalog's
    owner (not a view or another role's table that took the name)."""
    row = conn.execute(sqlfiles.get("catalog", "own_chunks"), {"schema": schema, "name": name})
    return row.fetchone() == (True,)


def key_column(info: TableInfo, requested: str | None) -> str:
    """The column that identifies a row: the one asked for, else the single-column primary key."""
    column = _key_column(info, requested)
    if info.columns[column].endswith("[]"):  # queued as text, it was never found again
        raise UsageError(
            f"key column {column!r} of {info.schema}.{info.name} is an array "
            f"({info.columns[column]}): a key must be one value (name a unique column of "
            "one value with --key)"
        )
    return trusted(info, column, "key")


def _key_column(info: TableInfo, requested: str | None) -> str:
    if requested is not None:
        require_column(info, requested)
        if requested not in info.unique_columns:
            raise UsageError(
                f"key column {requested!r} of {info.schema}.{info.name} is not unique: "
                "use a primary key or a column with a unique index"
            )
        if requested not in info.not_null:  # a NULL key would fail the writer's statement
            raise UsageError(
                f"key column {requested!r} of {info.schema}.{info.name} allows NULL: make it "
                f"NOT NULL (ALTER TABLE {info.schema}.{info.name} ALTER COLUMN {requested} "
                "SET NOT NULL) or use the primary key"
            )
        return requested
    if len(info.primary_key) != 1:
        what = "no primary key" if not info.primary_key else "a multi-column primary key"
        raise UsageError(
            f"table {info.schema}.{info.name} has {what}: add a single-column primary key "
            "or name a unique column with --key"
        )
    return info.primary_key[0]


def text_column(info: TableInfo, column: str) -> str:
    require_column(info, column)
    if column in info.generated:  # the update trigger's WHEN cannot name a generated column
        raise UsageError(
            f"column {column!r} of {info.schema}.{info.name} is GENERATED: watch a real column "
            "instead (e.g. the one it is computed from); PostgreSQL forbids generated columns "
            "in the WHEN of a BEFORE trigger, which pgembed's update capture is"
        )
    if info.columns[column] not in _TEXT_TYPES and not info.columns[column].startswith(
        ("character varying(", "character(")
    ):
        raise UsageError(
            f"column {column!r} of {info.schema}.{info.name} is {info.columns[column]}, not text"
        )
    return trusted(info, column, "text")


def trusted(info: TableInfo, column: str, kind: str) -> str:
    """`column`, unless a non-superuser owns its type: its casts to text would run that role's
    code inside pgembed's capture functions, as the role that ran `migrate`."""
    if column in info.untrusted:
        raise UsageError(
            untrusted_type(info.schema, info.name, column, info.untrusted[column], kind)
        )
    return column


def untrusted_type(schema: str, name: str, column: str, type_name: str, kind: str) -> str:
    return (
        f"{kind} column {column!r} of {schema}.{name} has type {type_name}, which a "
        "non-superuser owns: its casts would run that role's code as pgembed's roles; use a "
        "built-in type (integer, bigint, text, varchar, uuid, ...) or an extension's"
    )


def require_column(info: TableInfo, column: str) -> None:
    if column not in info.columns:
        raise NotFoundError(f"column {column!r} does not exist in table {info.schema}.{info.name}")


def model_problem(conn: psycopg.Connection, spec: ModelSpec) -> str | None:
    """problem() of a model's table and columns, and of a chunked model's chunk table."""
    reason = problem(conn, spec.table_schema, spec.table_name, spec.columns)
    if reason is not None or not spec.chunked:
        return reason
    own, taken = _chunk_names(conn, spec)
    if taken is None and not own:
        remedy = (  # nothing makes a shadow's again
            f"`pgembed reindex {spec.shadow_of} --abort` gives the reindex up; start it again"
            if spec.shadow_of is not None
            else f"`pgembed reindex {spec.name}` makes it again"
        )
        chunks = f"{spec.table_schema}.{naming.chunk_table_name(spec)}"
        return f"its chunk table {chunks} is gone: {remedy}"
    return taken


def switch_problem(conn: psycopg.Connection, spec: ModelSpec) -> str | None:
    """For a reindex's chunked shadow: why its switch, which renames the shadow's chunk table
    and indexes to the model's names, would fail (one taken since the reindex began, found only
    after every row was embedded again), else None."""
    if spec.shadow_of is None or not spec.chunked:
        return None
    live = registry.get(conn, spec.shadow_of)  # its own chunk table, if it has one, may stay
    return foreign_chunks(conn, replace(spec, name=spec.shadow_of), own=live.chunked)


def foreign_chunks(conn: psycopg.Connection, spec: ModelSpec, *, own: bool = True) -> str | None:
    """Why a name of the model's chunk table or its indexes is taken by an object that is not
    pgembed's (another role's table, view, index or type: a reindex's switch could not take
    it), else None. With `own` False, where the model has no chunk table (it truncates, or the
    switch has dropped it), a table of pgembed's owner by that name is taken too."""
    return _chunk_names(conn, spec, own)[1]


def _chunk_names(
    conn: psycopg.Connection, spec: ModelSpec, own: bool = True
) -> tuple[bool, str | None]:
    """Whether the model's chunk table is pgembed's, and foreign_chunks(), in one statement."""
    names = [
        naming.chunk_table_name(spec),
        naming.chunk_index_name(spec),
        naming.chunk_key_name(spec),
    ]
    row = conn.execute(
        sqlfiles.get("catalog", "chunk_names"),
        {"schema": spec.table_schema, "names": names, "exempt": own},
    ).fetchone()
    own, taken, owner = row if row else (False, [], None)
    if not taken:
        return own, None
    return own, (
        f"{', '.join(f'{spec.table_schema}.{name}' for name in taken)}, a name of its chunk table "
        "or its indexes, is taken by an object that is not pgembed's: rename or drop it, then "
        f"`pgembed reindex {spec.name}` (a chunk table of pgembed's whose owner changed is "
        f"given back by `ALTER TABLE ... OWNER TO {owner or 'its owner'}`)"
    )


def problem(conn: psycopg.Connection, schema: str, name: str, columns: list[str]) -> str | None:
    """Why a watched table can no longer be served (dropped, or a column gone), else None.

    The daemon skips such a model and `status` marks it broken; both say this one line."""
    try:
        info = inspect(conn, schema, name)
    except (NotFoundError, UsageError):  # gone, or another relation of that name now
        return f"table {schema}.{name} no longer exists (dropped or renamed)"
    if info.children:  # made after `model add`, which refuses them
        return inherited(schema, name, info.children)
    missing = [column for column in columns if column not in info.columns]
    if missing:
        return (
            f"table {schema}.{name} has no column {', '.join(map(repr, missing))} any more "
            "(dropped or renamed): rename it back, or `pgembed model remove` the model"
        )
    for column in columns:
        if column in info.untrusted:
            return untrusted_type(schema, name, column, info.untrusted[column], "watched") + (
                ", or `pgembed model remove` the model"
            )
    return None


def live_rows(conn: psycopg.Connection, schema: str, name: str) -> int:
    """A table's live rows as the statistics system counts them at each commit (0: unknown)."""
    row = conn.execute(
        sqlfiles.get("catalog", "table_live_rows"), {"schema": schema, "name": name}
    ).fetchone()
    return int(row[0] or 0) if row else 0
