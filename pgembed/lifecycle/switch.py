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

from pgembed import defaults
from pgembed.catalog import ddl, naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import DatabaseError, NotFoundError

log = logging.getLogger("pgembed.reindex")

T = TypeVar("T")


_LOCK_ROWS = (
    "SELECT name FROM pgembed.models WHERE name = %(name)s OR shadow_of = %(name)s "
    "ORDER BY name FOR UPDATE"
)
_UPDATE_MODEL = """
UPDATE pgembed.models SET
    model_ref = %(model_ref)s, pooling = %(pooling)s,
    normalize = %(normalize)s, dimensions = %(dimensions)s, max_seq_length = %(max_seq_length)s,
    query_prefix = %(query_prefix)s, document_prefix = %(document_prefix)s,
    hnsw_m = %(hnsw_m)s, hnsw_ef_construction = %(hnsw_ef_construction)s, version = %(version)s,
    precision = %(precision)s, precision_requested = %(precision_requested)s,
    precision_cosine = %(precision_cosine)s, precision_note = %(precision_note)s
WHERE name = %(name)s
"""
# The shadow's queue, failures and truncation marks become the model's; the old version's go.
# Claims on moved keys are voided (the claimer's write-back will find its model gone).
_MOVE_BOOKKEEPING = (
    "DELETE FROM pgembed.queue WHERE model = %(name)s",
    "UPDATE pgembed.queue SET model = %(name)s, next_attempt_at = now(), claimed_by = NULL "
    "WHERE model = %(shadow)s",
    "DELETE FROM pgembed.inbox WHERE model = %(name)s",
    "UPDATE pgembed.inbox SET model = %(name)s WHERE model = %(shadow)s",
    "DELETE FROM pgembed.failures WHERE model = %(name)s",
    "UPDATE pgembed.failures SET model = %(name)s WHERE model = %(shadow)s",
    "DELETE FROM pgembed.truncated WHERE model = %(name)s",
    "UPDATE pgembed.truncated SET model = %(name)s WHERE model = %(shadow)s",
    "DELETE FROM pgembed.batches WHERE model = %(name)s",
    "UPDATE pgembed.batches SET model = %(name)s WHERE model = %(shadow)s",
    "DELETE FROM pgembed.models WHERE name = %(shadow)s",
    "UPDATE pgembed.model_versions SET activated_at = now() "
    "WHERE name = %(name)s AND version = %(version)s",
    "SELECT pg_notify('pgembed', %(name)s) FROM (SELECT key FROM pgembed.queue "
    "WHERE model = %(name)s UNION ALL SELECT key FROM pgembed.inbox WHERE model = %(name)s) k "
    "LIMIT 1",
)


def swap_in(conn: psycopg.Connection, name: str) -> ModelSpec:
    """Replace model `name`'s column, index, triggers and settings by its shadow's."""
    return _retrying(conn, lambda: _swap_in(conn, name))


def _swap_in(conn: psycopg.Connection, name: str) -> ModelSpec:
    conn.execute(_LOCK_ROWS, {"name": name})
    old = registry.get(conn, name)
    shadow = registry.shadow(conn, name)
    if shadow is None:
        raise NotFoundError(f"model {name!r} has no reindex in progress")
    new = replace(
        shadow,
        name=name,
        embedding_column=old.embedding_column,
        shadow_of=None,
        ef_search=old.ef_search,
    )
    table = naming.table(old)
    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
    for spec in (old, shadow):
        ddl.drop_triggers(conn, spec)
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
    ddl.create_triggers(conn, new)
    moves = {"name": name, "shadow": shadow.name, "version": new.version}
    for statement in _MOVE_BOOKKEEPING:
        conn.execute(statement, moves)
    conn.execute(_UPDATE_MODEL, new.as_dict())
    return new


def swap_index(conn: psycopg.Connection, spec: ModelSpec, temporary: str) -> ModelSpec:
    """Drop the model's index and give the freshly built `temporary` its name and parameters."""

    def swap() -> ModelSpec:
        conn.execute(_LOCK_ROWS, {"name": spec.name})
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
        conn.execute(
            "UPDATE pgembed.models SET hnsw_m = %(m)s, hnsw_ef_construction = %(ef)s "
            "WHERE name = %(name)s",
            params,
        )
        conn.execute(
            "UPDATE pgembed.model_versions SET hnsw_m = %(m)s, hnsw_ef_construction = %(ef)s "
            "WHERE name = %(name)s AND version = (SELECT version FROM pgembed.models "
            "WHERE name = %(name)s)",
            params,
        )
        return registry.get(conn, spec.name)

    return _retrying(conn, swap)


def _retrying(conn: psycopg.Connection, work: Callable[[], T]) -> T:
    """Run `work` in a transaction that gives up on a lock after a short timeout; try again."""
    for attempt in range(1, defaults.SWITCH_ATTEMPTS + 1):
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, true)", (defaults.SWITCH_LOCK_TIMEOUT,)
                )
                return work()
        except psycopg.errors.LockNotAvailable:
            log.info("switch: table busy, attempt %d of %d", attempt, defaults.SWITCH_ATTEMPTS)
            time.sleep(0.5)
    raise DatabaseError(
        "could not lock the table for the switch: a long transaction holds it; "
        "run the same command again to finish"
    )
