"""The sync loop: drain the queues, wait for a NOTIFY (or the poll timer, or stop), repeat.

A NOTIFY only wakes the loop; the SKIP LOCKED claim is the source of truth, so a lost
notification costs latency, never data. Nothing here holds a transaction open across encode.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from . import catalog, db, embedder, migrate, models, queries, queue, source, writer
from .catalog import ModelSpec
from .embedding import embed_rows

log = logging.getLogger("pgembed.sync")

ProgressCallback = Callable[[str, int], None]


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = ()  # empty: every model in the catalog
    batch_size: int = 64
    lease_seconds: float = 60.0
    poll_seconds: float = 5.0
    max_attempts: int = 5
    once: bool = False
    heartbeat_seconds: float = 10.0


@dataclass
class Stats:
    written: int = 0
    skipped: int = 0
    failed: int = 0


class Worker:
    def __init__(
        self, url: str, options: Options, on_progress: ProgressCallback | None = None
    ) -> None:
        self.url = url
        self.options = options
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self.stats = Stats()
        self._on_progress = on_progress
        self._last_heartbeat = 0.0

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> Stats:
        conn = db.connect(self.url)
        listener = db.connect(self.url, vector=False)
        try:
            migrate.require_current(conn)
            specs = self.models(conn)
            for spec in specs:  # load before claiming, so no lease ticks while a model loads
                embedder.get(models.settings_of(spec))
            listener.execute("LISTEN pgembed")
            self._heartbeat(conn, specs, force=True)
            while not self.stop_event.is_set():
                did_work = self.drain(conn, specs)
                self._heartbeat(conn, specs)
                if self.options.once and not did_work:
                    break
                if not did_work:
                    self._wait(listener)
            conn.execute(queries.get("queue", "worker_exit"), {"worker": self.id})
        finally:
            conn.close()
            listener.close()
        return self.stats

    def models(self, conn: psycopg.Connection) -> list[ModelSpec]:
        if not self.options.models:
            return catalog.all_models(conn)
        return [catalog.get(conn, name) for name in self.options.models]

    def drain(self, conn: psycopg.Connection, specs: Sequence[ModelSpec]) -> bool:
        """One batch per model in turn, until every queue is empty or stop is asked."""
        did_work = False
        busy = list(specs)
        while busy and not self.stop_event.is_set():
            busy = [spec for spec in busy if self.batch(conn, spec)]
            did_work = did_work or bool(busy)
        return did_work

    def batch(self, conn: psycopg.Connection, spec: ModelSpec) -> bool:
        """Claim, read, embed, write one batch of one model; False when its queue had nothing."""
        started = time.monotonic()
        claims = queue.claim(
            conn, spec.name, self.id, self.options.batch_size, self.options.lease_seconds
        )
        if not claims:
            return False
        rows = source.read(conn, spec, [c.key for c in claims])
        result = embed_rows(embedder.get(models.settings_of(spec)), rows)
        by_key = {c.key: c for c in claims}
        failed_keys = {row.key for row, _ in result.failed}
        with conn.transaction():
            written = writer.write(
                conn,
                spec,
                [row.key for row in result.rows],
                [row.text_md5 for row in result.rows],
                result.matrix(),
            )
            done = [c for c in claims if c.key not in failed_keys]
            queue.complete(conn, spec.name, done)
            self._bookkeeping(
                conn, spec, written, set(result.truncated), time.monotonic() - started
            )
        for row, error in result.failed:
            moved = queue.fail(conn, spec.name, by_key[row.key], error, self.options.max_attempts)
            log.warning(
                "model=%s key=%s failed%s: %s",
                spec.name,
                row.key,
                " (moved to failures)" if moved else "",
                error,
            )
        seconds = time.monotonic() - started
        self.stats.written += len(written)
        self.stats.skipped += len(claims) - len(written) - len(result.failed)
        self.stats.failed += len(result.failed)
        log.info(
            "model=%s rows=%d written=%d seconds=%.2f rows_per_second=%.1f",
            spec.name,
            len(claims),
            len(written),
            seconds,
            len(claims) / max(seconds, 1e-9),
        )
        if self._on_progress:
            self._on_progress(spec.name, len(claims))
        return True

    def _bookkeeping(
        self,
        conn: psycopg.Connection,
        spec: ModelSpec,
        written: set[str],
        truncated: set[str],
        seconds: float,
    ) -> None:
        keys = sorted(written)
        params = {"model": spec.name, "keys": keys}
        conn.execute(queries.get("queue", "forget_failures"), params)
        conn.execute(queries.get("queue", "unmark_truncated"), params)
        conn.execute(
            queries.get("queue", "mark_truncated"),
            {"model": spec.name, "keys": sorted(written & truncated)},
        )
        conn.execute(
            queries.get("queue", "log_batch"),
            {"model": spec.name, "worker": self.id, "rows": len(keys), "seconds": seconds},
        )

    def _heartbeat(
        self, conn: psycopg.Connection, specs: Sequence[ModelSpec], force: bool = False
    ) -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < self.options.heartbeat_seconds:
            return
        self._last_heartbeat = now
        conn.execute(
            queries.get("queue", "heartbeat"),
            {
                "worker": self.id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "models": [s.name for s in specs],
            },
        )
        conn.execute(queries.get("queue", "prune"))

    def _wait(self, listener: psycopg.Connection) -> None:
        """Sleep until a NOTIFY, the poll timer or stop; in short slices so stop is prompt."""
        deadline = time.monotonic() + self.options.poll_seconds
        while not self.stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for _ in listener.notifies(timeout=min(remaining, 0.5), stop_after=1):
                return


def queued_count(conn: psycopg.Connection, model_names: Sequence[str]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgembed.queue WHERE model = ANY(%s)", (list(model_names),)
    ).fetchone()
    return int(row[0]) if row else 0
