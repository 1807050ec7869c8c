"""Claim, complete, release and fail queued keys. Each call is one short transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from pgembed import sqlfiles


@dataclass(frozen=True)
class Claim:
    key: str
    seq: int
    attempts: int


def claim(
    conn: psycopg.Connection, model: str, worker: str, limit: int, lease_seconds: float
) -> list[Claim]:
    rows = conn.execute(
        sqlfiles.get("queue", "claim"),
        {"model": model, "worker": worker, "limit": limit, "lease": lease_seconds},
    ).fetchall()
    return [Claim(key, seq, attempts) for key, seq, attempts in rows]


def transfer(conn: psycopg.Connection, model: str, limit: int = 10_000) -> int:
    """Move captured inserts from the inbox to the queue; returns how many keys were moved."""
    cur = conn.execute(sqlfiles.get("queue", "transfer"), {"model": model, "limit": limit})
    return cur.rowcount


def _pairs(model: str, claims: Sequence[Claim]) -> dict[str, object]:
    return {"model": model, "keys": [c.key for c in claims], "seqs": [c.seq for c in claims]}


def complete(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("queue", "complete"), _pairs(model, claims))


def release(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("queue", "release"), _pairs(model, claims))


def fail(conn: psycopg.Connection, model: str, claim: Claim, error: str, max_attempts: int) -> bool:
    """Record a failed attempt; returns True when the key moved to the failures table."""
    params = {
        "model": model,
        "key": claim.key,
        "seq": claim.seq,
        "error": error[:2000],
        "max_attempts": max_attempts,
    }
    with conn.transaction():
        moved = conn.execute(sqlfiles.get("queue", "fail_final"), params).rowcount > 0
        if not moved:
            conn.execute(sqlfiles.get("queue", "fail_retry"), params)
    return moved


def retry_failures(conn: psycopg.Connection, models: Sequence[str]) -> int:
    """Move failed keys back to the queue; returns how many."""
    with conn.transaction():
        count = conn.execute(sqlfiles.get("queue", "retry_failures"), {"models": list(models)})
        for model in models:
            conn.execute("SELECT pg_notify('pgembed', %s)", (model,))
    return count.rowcount
