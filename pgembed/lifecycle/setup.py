"""A model's setup in steps that never hold its table for more than a moment, and their resume.

`model add` and a reindex's start used to run in one transaction that held the table's ACCESS
EXCLUSIVE lock while it built the HNSW index and queued every row: an application writing every
20 ms waited up to 27 s at a million rows. Now:

1. one short transaction (catalog.ddl.retrying_locks: lock_timeout, tried again) registers the
   model with its pending steps in `pgembed.models.status`, adds the column (catalog-only: no
   default), the chunk table and the capture triggers. From its commit on, every write is queued
   by the triggers;
2. the HNSW index (and the full-text one) is built CONCURRENTLY: SHARE UPDATE EXCLUSIVE, which no
   read or write waits for; an invalid index left by an interrupted build is dropped and built
   again (indexbuild.build);
3. the rows that were there before are queued in batches over the key (keyset pagination), each
   batch its own transaction that reads the table and writes only pgembed.queue;
4. the status becomes 'active'.

Every step can be repeated: a row that has a vector or is queued already is skipped, so running
the command again after an interruption (a kill, a lost connection) finishes the setup and loses
no row. Removing a model drops its objects in one short transaction and its bookkeeping rows
(up to a million queue entries) after it, in batches.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed import capture, db, defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import DatabaseError
from pgembed.lifecycle import indexbuild
from pgembed.sync import store

log = logging.getLogger("pgembed.setup")

ACTIVE = "active"
ADDING = "adding"
INDEX = "index"  # the model's HNSW index is still to be built
FULLTEXT = "fulltext"  # its full-text index is still to be built


class Reporter:
    """What a setup tells its user as it goes; these defaults log."""

    def step(self, text: str) -> None:
        """A step starts, or something the user should know ("queuing rows", a hint)."""
        log.info("%s", text)

    def queued(self, done: int, estimate: int) -> None:
        """Rows looked at so far, of about `estimate` in the table."""

    def index(self, sample: indexbuild.BuildProgress) -> None:
        """A sample of the index build's progress."""

    def waiting(self, text: str) -> None:
        """The setup waits for another session (a lock, an older transaction)."""
        log.warning("%s", text)


@dataclass(frozen=True)
class Pending:
    """The steps of a model's setup still to do."""

    index: bool
    fulltext: bool

    @property
    def status(self) -> str:
        return "+".join([ADDING, *[INDEX] * self.index, *[FULLTEXT] * self.fulltext])


def pending(conn: psycopg.Connection, name: str) -> Pending | None:
    """What is left of model `name`'s setup; None when it is complete (or the model is gone)."""
    row = conn.execute(sqlfiles.get("catalog", "model_setup"), {"name": name}).fetchone()
    if row is None or row[0] == ACTIVE or not str(row[0]).startswith(ADDING):
        return None
    words = str(row[0]).split("+")
    return Pending(index=INDEX in words, fulltext=FULLTEXT in words)


def mark(conn: psycopg.Connection, name: str, steps: Pending | None) -> None:
    """Record the steps left (None: the setup is complete)."""
    status = ACTIVE if steps is None else steps.status
    conn.execute(sqlfiles.get("catalog", "set_model_setup"), {"name": name, "status": status})


def register(
    conn: psycopg.Connection,
    spec: ModelSpec,
    steps: Pending,
    *,
    version_of: str,
    on_wait: ddl.OnWait | None = None,
) -> None:
    """Step 1: the catalog rows, column, chunk table and triggers, in one short transaction."""

    def create() -> None:
        ddl.lock_table(conn, spec)  # first: a timeout then leaves nothing half-done
        registry.insert(conn, spec)
        mark(conn, spec.name, steps)
        registry.record_version(conn, spec, version_of, active=spec.shadow_of is None)
        ddl.add_column(conn, spec)
        ddl.create_chunks(conn, spec)  # a new, empty table: its index is made at once
        capture.create_triggers(conn, spec)
        capture.notify(conn, spec.name)  # workers learn of the model

    ddl.retrying_locks(conn, spec.table_schema, spec.table_name, create, on_wait)


def finish(
    conn: psycopg.Connection,
    url: str | None,
    spec: ModelSpec,
    reporter: Reporter,
    build: indexbuild.BuildSettings | None = None,
) -> int:
    """Steps 2-4 of what is pending for `spec` (on an autocommit `conn`); the rows queued.

    Given the `url`, a second session reports the index build's progress and what it waits for.
    """
    steps = pending(conn, spec.name)
    if steps is None:
        return 0
    if steps.index:
        reporter.step(f"building index {naming.index_name(spec)} (concurrently)")
        settings = build or indexbuild.BuildSettings()
        if url is None:
            indexbuild.build_here(conn, spec, naming.index_name(spec), settings)
        else:
            indexbuild.build(
                url,
                spec,
                naming.index_name(spec),
                settings,
                reporter.index,
                on_wait=reporter.waiting,
                on_note=reporter.step,
            )
        steps = Pending(index=False, fulltext=steps.fulltext)
        mark(conn, spec.name, steps)
    if steps.fulltext:
        reporter.step(f"building full-text index {naming.fulltext_index_name(spec)} (concurrently)")
        ddl.drop_invalid_fulltext_index(conn, spec)
        if url is None:
            ddl.create_fulltext_index(conn, spec, concurrently=True)
        else:
            with indexbuild.reporting_waits(url, conn, reporter.waiting):
                ddl.create_fulltext_index(conn, spec, concurrently=True)
    queued = enqueue(conn, spec, reporter)
    mark(conn, spec.name, None)
    return queued


def enqueue(
    conn: psycopg.Connection,
    spec: ModelSpec,
    reporter: Reporter,
    batch: int = defaults.ENQUEUE_BATCH,
) -> int:
    """Step 3: queue every row with text and no vector, `batch` keys per transaction, in key
    order; returns how many were queued. Rows written meanwhile are queued by the triggers."""
    estimate = _estimated_rows(conn, spec)
    reporter.step(f"queuing the existing rows of {spec.qualified_table} (about {estimate})")
    first, after = _enqueue_statements(spec)
    queued = seen = 0
    last: str | None = None
    while True:
        with conn.transaction():
            store.row_security_errors(conn)  # rows a policy hides would never be queued
            if last is None:
                row = conn.execute(first, {"model": spec.name, "limit": batch}).fetchone()
            else:
                params = {"model": spec.name, "limit": batch, "after": last}
                row = conn.execute(after, params).fetchone()
            assert row is not None  # an aggregate: always one row
            rows, added, last_key = int(row[0]), int(row[1]), row[2]
            queued += added
            seen += rows
            if added:
                capture.notify(conn, spec.name)
        reporter.queued(seen, max(estimate, seen))
        if rows < batch or last_key is None:
            return queued
        last = last_key


def _enqueue_statements(spec: ModelSpec) -> tuple[sql.Composed, sql.Composed]:
    """One batch: the next keys after the cursor (none: from the start), queued unless they
    have a vector or no text; returns the keys read, those queued and the last key (as text)."""
    key = sql.Identifier(spec.key_column)

    def statement(where: sql.Composable) -> sql.Composed:
        return sql.SQL(
            "WITH batch AS ("
            " SELECT {key} AS k, {vector} IS NULL"
            " AND pgembed._has_text_v1(({text})::pg_catalog.text) AS wanted"
            " FROM {table} WHERE {where} ORDER BY {key} LIMIT %(limit)s"
            "), queued AS ("
            " INSERT INTO pgembed.queue (model, key) SELECT %(model)s, k::pg_catalog.text"
            " FROM batch WHERE wanted ON CONFLICT (model, key) DO NOTHING RETURNING 1"
            ") SELECT (SELECT pg_catalog.count(*) FROM batch)::integer,"
            " (SELECT pg_catalog.count(*) FROM queued)::integer,"
            " (SELECT k::pg_catalog.text FROM batch ORDER BY k DESC LIMIT 1)"
        ).format(
            key=key,
            vector=sql.Identifier(spec.embedding_column),
            text=naming.text_expression(spec),
            table=naming.table(spec),
            where=where,
        )

    not_null = sql.SQL("{} IS NOT NULL").format(key)
    # A schema-qualified operator, not one another role put first on the search_path (a varchar
    # key would otherwise match a public `>` (varchar, varchar) before text's); the key type's
    # own for an extension's type, whose index gives the order (naming.key_greater).
    after = sql.SQL("{} {} %(after)s::pg_catalog.text::{}").format(
        naming.key_at(spec, spec.table_name), naming.key_greater(spec), naming.key_type(spec)
    )
    return statement(not_null), statement(after)


def _estimated_rows(conn: psycopg.Connection, spec: ModelSpec) -> int:
    """The planner's row estimate for the table (no scan); 0 for one never analysed."""
    return indexbuild.estimated_rows(conn, spec.table_schema, spec.table_name)


def forget(conn: psycopg.Connection, name: str, batch: int = defaults.ENQUEUE_BATCH) -> None:
    """A removed model's queue, inbox, failures, truncation and batch records, `batch` rows per
    transaction: a million queue entries never hold anything for long. Its catalog row is gone
    already, so workers no longer claim them. Each statement deletes only while no model of
    that name is registered: a `model add` of the name that committed meanwhile keeps its rows
    (its catalog row commits before any of them)."""
    for bookkeeping in ("queue", "inbox", "failures", "truncated", "batches"):
        statement = sql.SQL(
            "DELETE FROM pgembed.{table} WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid "
            "FROM pgembed.{table} WHERE model = %(model)s LIMIT %(limit)s)) "
            "AND NOT EXISTS (SELECT FROM pgembed.models WHERE name = %(model)s)"
        ).format(table=sql.Identifier(bookkeeping))
        while True:
            with conn.transaction():
                cur = conn.execute(statement, {"model": name, "limit": batch})
            if cur.rowcount < batch:
                break


def leftovers(conn: psycopg.Connection, name: str) -> bool:
    """Whether a model of this name, no longer in the catalog, left queue entries behind (a
    `model remove` interrupted after its catalog step). Asked in one statement with the catalog:
    the entries of a model registered meanwhile are not leftovers."""
    row = conn.execute(
        "SELECT (EXISTS (SELECT 1 FROM pgembed.queue WHERE model = %(m)s) "
        "OR EXISTS (SELECT 1 FROM pgembed.inbox WHERE model = %(m)s)) "
        "AND NOT EXISTS (SELECT 1 FROM pgembed.models WHERE name = %(m)s)",
        {"m": name},
    ).fetchone()
    return bool(row and row[0])


def guard_older_models(conn: psycopg.Connection) -> list[str]:
    """`pgembed migrate`'s last step: models made before the trigger that guards their vectors
    (capture.guard_vectors), or before it watched updates and flagged writes, get it, each table
    in a short transaction of its own (ddl.retrying_locks), so that no lock is held on an
    application's table for longer. One line for each model it was added to or could not be (a
    table this role may not alter, or busy); a model whose table or vector column is gone is left
    to `status`."""
    said: list[str] = []
    for spec in registry.all_models(conn):
        row = conn.execute(
            sqlfiles.get("lifecycle", "unguarded"),
            {
                "schema": spec.table_schema,
                "table": spec.table_name,
                "column": spec.embedding_column,
                "trigger": naming.trigger_names(spec)[4],
            },
        ).fetchone()
        if not row or not row[0]:
            continue
        where = f"{spec.table_schema}.{spec.table_name}"
        guard = functools.partial(capture.guard_vectors, conn, spec)
        try:
            ddl.retrying_locks(conn, spec.table_schema, spec.table_name, guard)
        except psycopg.errors.InsufficientPrivilege as exc:
            said.append(
                f"model {spec.name}: the vectors of {where} are guarded as before until its "
                f"owner runs `pgembed alter-table {where} 'SELECT 1'` ({db.first_line(exc)})"
            )
        except DatabaseError as exc:  # the table stayed busy
            said.append(f"model {spec.name}: {exc}; run `pgembed migrate` again")
        else:
            said.append(
                f"model {spec.name}: a vector an INSERT brings into {where} is now cleared, and "
                "pgembed.writing is honoured for its owner and the daemon role only"
            )
    return said
