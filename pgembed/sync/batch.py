"""One batch of one model in three steps: fetch (claim + read), embed, store (write + account).

fetch and store are short database work; embed runs outside any transaction. `run_batch` does
the three in a row; pipeline.py overlaps them across consecutive batches.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg

from pgembed import sqlfiles
from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.lifecycle import models
from pgembed.sync import queue, source, writer
from pgembed.sync.isolate import Embedded, embed_rows
from pgembed.sync.source import SourceRow

log = logging.getLogger("pgembed.sync")


class ModelChanged(Exception):
    """The model was altered, reindexed or removed after the worker read the catalog."""


@dataclass(frozen=True)
class BatchResult:
    claimed: int
    written: int
    failed: int

    @property
    def skipped(self) -> int:
        """Keys whose row was gone, blank, or changed while it was being embedded."""
        return self.claimed - self.written - self.failed


@dataclass(frozen=True)
class BatchConfig:
    worker_id: str
    batch_size: int
    lease_seconds: float
    max_attempts: int
    device: str = "cpu"


@dataclass(frozen=True)
class Claimed:
    """Claimed keys and the rows they still have (gone or blank rows do not come back)."""

    spec: ModelSpec
    claims: list[queue.Claim]
    rows: list[SourceRow]


def fetch(conn: psycopg.Connection, spec: ModelSpec, config: BatchConfig) -> Claimed | None:
    """Claim up to a batch of ready keys and read their text; None when nothing is ready."""
    claims = queue.claim(conn, spec.name, config.worker_id, config.batch_size, config.lease_seconds)
    if not claims and queue.transfer(conn, spec.name):
        claims = queue.claim(
            conn, spec.name, config.worker_id, config.batch_size, config.lease_seconds
        )
    if not claims:
        return None
    return Claimed(spec, claims, source.read(conn, spec, [c.key for c in claims]))


def embed(claimed: Claimed, config: BatchConfig) -> Embedded:
    settings = models.runtime_settings(claimed.spec, config.device)
    return embed_rows(embedder.get(settings), claimed.rows)


def store(
    conn: psycopg.Connection,
    claimed: Claimed,
    result: Embedded,
    config: BatchConfig,
    seconds: float,
) -> BatchResult:
    """Write the vectors whose text is unchanged, complete the claims, record failures."""
    spec, claims = claimed.spec, claimed.claims
    failed_keys = {row.key for row, _ in result.failed}
    with conn.transaction():
        if _changed(conn, spec):
            release(conn, claimed)  # commits with this transaction: ready again
            changed = True
        else:
            changed = False
            written = writer.write(
                conn,
                spec,
                [row.key for row in result.rows],
                [row.text_md5 for row in result.rows],
                result.matrix(),
            )
            queue.complete(conn, spec.name, [c for c in claims if c.key not in failed_keys])
            _account(conn, spec, config.worker_id, written, result, seconds)
    if changed:
        raise ModelChanged("changed since this worker read the catalog: batch given back")
    _record_failures(conn, spec, config, {c.key: c for c in claims}, result)
    log.info(
        "model=%s rows=%d written=%d failed=%d seconds=%.2f rows_per_second=%.1f",
        spec.name,
        len(claims),
        len(written),
        len(result.failed),
        seconds,
        len(claims) / max(seconds, 1e-9),
    )
    return BatchResult(len(claims), len(written), len(result.failed))


def release(conn: psycopg.Connection, claimed: Claimed) -> None:
    """Hand a batch that will not be embedded back to the queue at once."""
    queue.release(conn, claimed.spec.name, claimed.claims)


def run_batch(conn: psycopg.Connection, spec: ModelSpec, config: BatchConfig) -> BatchResult | None:
    """Process one batch without overlap; None when the model's queue has nothing ready."""
    started = time.monotonic()
    claimed = fetch(conn, spec, config)
    if claimed is None:
        return None
    result = embed(claimed, config)
    return store(conn, claimed, result, config, time.monotonic() - started)


def _changed(conn: psycopg.Connection, spec: ModelSpec) -> bool:
    """Whether the catalog no longer has the settings these vectors were made with.

    The share lock on the catalog row lasts until the write commits: a reindex switch takes that
    row FOR UPDATE before it swaps the column, so a write lands wholly before the swap, or is
    refused after it.
    """
    current = registry.locked(conn, spec.name)
    return current is None or not registry.same_space(current, spec)


def _account(
    conn: psycopg.Connection,
    spec: ModelSpec,
    worker_id: str,
    written: set[str],
    result: Embedded,
    seconds: float,
) -> None:
    keys = sorted(written)
    params = {"model": spec.name, "keys": keys}
    conn.execute(sqlfiles.get("queue", "forget_failures"), params)
    conn.execute(sqlfiles.get("queue", "unmark_truncated"), params)
    truncated = sorted(written & set(result.truncated))
    conn.execute(sqlfiles.get("queue", "mark_truncated"), {"model": spec.name, "keys": truncated})
    conn.execute(
        sqlfiles.get("queue", "log_batch"),
        {"model": spec.name, "worker": worker_id, "rows": len(keys), "seconds": seconds},
    )


def _record_failures(
    conn: psycopg.Connection,
    spec: ModelSpec,
    config: BatchConfig,
    claims: dict[str, queue.Claim],
    result: Embedded,
) -> None:
    for row, error in result.failed:
        moved = queue.fail(conn, spec.name, claims[row.key], error, config.max_attempts)
        log.warning(
            "model=%s key=%s failed%s: %s",
            spec.name,
            row.key,
            " (moved to failures)" if moved else ", will retry",
            error,
        )
