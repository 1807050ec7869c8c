"""The atomic part of a reindex: one short transaction that swaps the new column or index in.

Searches read the old column until the commit and the new one after it, never a mix. The
transaction takes the catalog rows first and then the table (in that order, as the sync worker's
write-back does), and waits at most `lock_timeout` for the table so that a long transaction of the
application never leaves searches queued behind the switch; it simply tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import psycopg
from psycopg import sql

from pgembed import capture, defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry, tables
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import DatabaseError, NotFoundError, UsageError

log = logging.getLogger("pgembed.reindex")

T = TypeVar("T")


def swap_in(conn: psycopg.Connection, name: str) -> ModelSpec:
    """Replace model `name`'s column, index, triggers and settings by its shadow's."""
    return _retrying(conn, lambda: _swap_in(conn, name))


def _swap_in(conn: psycopg.Connection, name: str) -> ModelSpec:
    conn.execute(sqlfiles.get("lifecycle", "lock_model_rows"), {"name": name})
    old = registry.get(conn, name)
    shadow = registry.shadow(conn, name)
    if shadow is None:
        raise NotFoundError(f"model {name!r} has no reindex in progress")
    new = replace(
        shadow,
        name=name,
        embedding_column=old.embedding_column,
        shadow_of=None,
        ef_search=old.ef_search,  # two walks are not kept (update_model)
    )
    table = naming.table(old)
    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
    # A view made since the reindex began: refused here in one line, the reindex resumable.
    ddl.refuse_column_views(conn, old, f"the switch of {name!r} to version {shadow.version}")
    for spec in (old, shadow):
        capture.drop_triggers(conn, spec)
    _swap_chunks(conn, old, shadow, new)  # first: the old chunks' row policy names the column
    conn.execute(  # the old index goes with its column
        sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(table, sql.Identifier(old.embedding_column))
    )
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
            table, sql.Identifier(shadow.embedding_column), sql.Identifier(new.embedding_column)
        )
    )
    conn.execute(
        sql.SQL("ALTER INDEX IF EXISTS {} RENAME TO {}").format(
            sql.Identifier(old.table_schema, naming.index_name(shadow)),
            sql.Identifier(naming.index_name(new)),
        )
    )
    capture.create_triggers(conn, new)
    moves = {"name": name, "shadow": shadow.name, "version": new.version}
    for statement in sqlfiles.statements("lifecycle", "move_bookkeeping"):
        conn.execute(statement, moves)
    capture.notify(conn, name)  # the shadow's queue is the model's now: wake its workers
    conn.execute(sqlfiles.get("lifecycle", "update_model"), new.as_dict())
    return new


def _swap_chunks(
    conn: psycopg.Connection, old: ModelSpec, shadow: ModelSpec, new: ModelSpec
) -> None:
    """The old version's chunks go; the shadow's chunk table, its key and index take the
    model's names."""
    ddl.drop_chunks(conn, old)
    if not shadow.chunked:
        return
    taken = tables.foreign_chunks(conn, new, own=False)  # the old chunks are gone
    if taken is not None:
        raise UsageError(f"model {new.name!r}: {taken}")
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(
            naming.chunk_table(shadow), sql.Identifier(naming.chunk_table_name(new))
        )
    )
    for renamed in (naming.chunk_index_name, naming.chunk_key_name):
        conn.execute(
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(shadow.table_schema, renamed(shadow)),
                sql.Identifier(renamed(new)),
            )
        )


def swap_index(conn: psycopg.Connection, spec: ModelSpec, temporary: str) -> ModelSpec:
    """Drop the model's index and give the freshly built `temporary` its name and parameters."""

    def swap() -> ModelSpec:
        conn.execute(sqlfiles.get("lifecycle", "lock_model_rows"), {"name": spec.name})
        conn.execute(
            sql.SQL("DROP INDEX IF EXISTS {}").format(
                sql.Identifier(spec.table_schema, naming.index_name(spec))
            )
        )
        conn.execute(
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(spec.table_schema, temporary),
                sql.Identifier(naming.index_name(spec)),
            )
        )
        params = {"name": spec.name, "m": spec.hnsw_m, "ef": spec.hnsw_ef_construction}
        for statement in sqlfiles.statements("lifecycle", "set_hnsw_parameters"):
            conn.execute(statement, params)
        return registry.get(conn, spec.name)

    return _retrying(conn, swap)


def _retrying(conn: psycopg.Connection, work: Callable[[], T]) -> T:
    """Run `work` in a transaction that gives up on a lock after a short timeout; try again."""
    for attempt in range(1, defaults.SWITCH_ATTEMPTS + 1):
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pg_catalog.set_config('lock_timeout', %s, true)",
                    (defaults.SWITCH_LOCK_TIMEOUT,),
                )
                return work()
        except psycopg.errors.LockNotAvailable:
            log.info("switch: table busy, attempt %d of %d", attempt, defaults.SWITCH_ATTEMPTS)
            time.sleep(0.5)
    raise DatabaseError(
        "could not lock the table for the switch: a long transaction holds it; "
        "run the same command again to finish"
    )
