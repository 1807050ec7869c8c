"""What `pgembed status` reports: per model, progress, backlog, failures, throughput, workers."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgembed import defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry, trust
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import engines
from pgembed.lifecycle import counts, reindex, setup


def model_status(conn: psycopg.Connection, spec: ModelSpec, exact: bool = False) -> dict[str, Any]:
    """The model's numbers; `broken` says why its table cannot be read (its rows are then None).
    A table of more than counts.EXACT_UP_TO rows is not counted but estimated (`counts` says
    which), unless `exact`."""
    problem = trust.broken(conn, spec)
    with conn.cursor(row_factory=dict_row) as cur:
        stats = (
            cur.execute(sqlfiles.get("lifecycle", "queue_stats"), {"model": spec.name}).fetchone()
            or {}
        )
        live = {"live": defaults.LIVE_WORKER_SECONDS}
        workers = [
            w
            for w in cur.execute(sqlfiles.get("lifecycle", "live_workers"), live).fetchall()
            if spec.name in w["models"]
        ]
        idle = _no_live_worker(cur, spec.name) if stats.get("queued") and not workers else None
    rows = None if problem else counts.rows(conn, spec, exact)
    chunks, chunks_exact = (None, True) if problem else _chunks(conn, spec, exact)
    index = None if problem else _index(conn, spec)
    unfinished = setup.pending(conn, spec.name)
    oldest = stats.get("oldest_queued_seconds")
    return {
        "name": spec.name,
        "broken": problem,
        "table": spec.qualified_table,
        # The text columns embedded together (joined by a newline), in order; `column` (the first
        # alone) and `columns` are the earlier names, kept for readers of this JSON.
        "text_columns": list(spec.text_columns),
        "column": spec.text_column,
        "columns": list(spec.text_columns),
        "embedding_column": spec.embedding_column,
        "model": spec.model_ref,
        "pooling": spec.pooling,
        "dimensions": spec.dimensions,
        "rows_total": rows.total if rows else None,
        "rows_embedded": rows.embedded if rows else None,
        # "exact", or "estimate": a large table's rows from a sample of its pages (counts.py).
        "counts": None if rows is None else "exact" if rows.exact and chunks_exact else "estimate",
        "long_texts": spec.long_texts,
        # A chunked model's windows past the first (0 for a model that truncates).
        "chunks": chunks,
        # The HNSW index: built, invalid (an interrupted build) or missing (`model add --backfill`
        # before its end, or dropped by hand); searches scan the column without one.
        "index": index,
        # The steps of `model add` not done yet ("adding", "+index", "+fulltext"): one that is
        # running, or was interrupted (running it again finishes them); None once set up.
        "setup": unfinished.status if unfinished else None,
        "queued": stats.get("queued", 0),
        "oldest_queued_seconds": round(oldest, 3) if oldest is not None else None,
        "lag_seconds": round(oldest, 3) if oldest is not None else 0.0,
        "failed": stats.get("failed", 0),
        "truncated": stats.get("truncated", 0),
        "rows_per_second": round(stats.get("rows_per_second") or 0.0, 2),
        "precision": spec.precision,
        "engine": engines.describe(spec.precision),  # what computes the vectors; the note: why
        "precision_requested": spec.precision_requested,
        "precision_cosine": spec.precision_cosine,
        "precision_note": spec.precision_note,
        "workers": [
            {
                "id": w["id"],
                "host": w["host"],
                "pid": w["pid"],
                "last_heartbeat": w["heartbeat_at"].isoformat(),
                "models": w["models"],
            }
            for w in workers
        ],
        # Keys wait and no live worker serves the model: when one was last seen, else None.
        "no_live_worker": idle,
    }


def _no_live_worker(cur: psycopg.Cursor[dict[str, Any]], model: str) -> dict[str, Any]:
    """When a worker of `model` was last seen, and by what: its last heartbeat, or the model's
    last batch (a worker that stopped cleanly removes its heartbeat); all None when neither is
    left (running workers prune heartbeats after a day, batches after an hour)."""
    seen = cur.execute(sqlfiles.get("lifecycle", "last_worker_seen"), {"model": model}).fetchone()
    at = seen["seen_at"] if seen else None
    return {
        "last_seen": at.isoformat() if at else None,
        "last_seen_seconds": round(seen["seen_seconds"], 3) if seen and at else None,
        "last_seen_by": seen["seen_by"] if seen else None,
    }


def _index(conn: psycopg.Connection, spec: ModelSpec) -> str:
    valid = ddl.index_valid(conn, spec.table_schema, naming.index_name(spec))
    return {True: "built", False: "invalid", None: "missing"}[valid]


def _chunks(conn: psycopg.Connection, spec: ModelSpec, exact: bool) -> tuple[int, bool]:
    """Rows of the model's chunk table (0 for a model that truncates), and whether counted
    exactly. Only for a model that is not broken: its chunk table is pgembed's."""
    if not spec.chunked:
        return 0, True
    return counts.chunks(conn, spec, exact)


def all_status(conn: psycopg.Connection, exact: bool = False) -> list[dict[str, Any]]:
    """One entry per model; a reindex in progress shows under the model it will replace.
    `exact`: count every table's rows, however large (else large ones are estimated)."""
    specs = registry.all_models(conn)
    shadows = {s.shadow_of: s for s in specs if s.shadow_of is not None}
    return [
        {
            **model_status(conn, spec, exact),
            "version": spec.version,
            "reindex": (
                reindex_status(conn, shadows[spec.name], exact) if spec.name in shadows else None
            ),
        }
        for spec in specs
        if spec.shadow_of is None
    ]


def reindex_status(
    conn: psycopg.Connection, shadow: ModelSpec, exact: bool = False
) -> dict[str, Any]:
    """A reindex's progress, estimated on a large table as the model's rows are (a count of
    every row took 0.1-0.2 s at a million, at every `status --watch` refresh)."""
    problem = trust.broken(conn, shadow)
    done = reindex.ShadowProgress(0, 0, 0) if problem else reindex.progress(conn, shadow, exact)
    return {
        "shadow": shadow.name,
        "broken": problem,
        "version": shadow.version,
        "model": shadow.model_ref,
        "pooling": shadow.pooling,
        "dimensions": shadow.dimensions,
        "rows_embedded": done.embedded,
        "rows_total": done.total,
        "counts": "exact" if done.exact else "estimate",
        "queued": done.queued,
        "index_built": bool(ddl.index_valid(conn, shadow.table_schema, naming.index_name(shadow))),
    }


def failures(conn: psycopg.Connection, limit: int = 20) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            sqlfiles.get("lifecycle", "recent_failures"), {"limit": limit}
        ).fetchall()
