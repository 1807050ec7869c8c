"""`pgembed status`: per model, progress, backlog, failures, throughput, workers."""

from __future__ import annotations

import json
import time
from typing import Any

import click
import psycopg

from pgembed.cli import terminal
from pgembed.cli.app import App, pass_app
from pgembed.lifecycle import counts, status


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@click.option(
    "--exact",
    is_flag=True,
    help="Count every table's rows (a full scan; by default a table of more than "
    f"{counts.EXACT_UP_TO:,} rows is estimated from a sample of its pages, shown with ~).",
)
@pass_app
def status_cmd(app: App, as_json: bool, watch: bool, interval: float, exact: bool) -> None:
    """Per model: rows embedded, backlog, lag, failures, throughput and live workers."""
    with app.connect() as conn:
        if not watch:
            terminal.echo(_report(conn, as_json, exact))
            return
        try:
            while True:
                text = _report(conn, as_json, exact)
                click.clear()
                terminal.echo(text)
                time.sleep(interval)
        except KeyboardInterrupt:  # Ctrl-C is how a watch ends: not an error
            return


def _report(conn: psycopg.Connection, as_json: bool, exact: bool) -> str:
    report = status.all_status(conn, exact)
    return json.dumps(report, indent=2) if as_json else _status_text(conn, report)


def _no_worker_text(m: dict[str, Any]) -> str:
    """Rows wait and no live worker serves the model: since when one was last seen, by the
    trace pgembed keeps (its heartbeat, or the model's last batch), else the oldest row's wait."""
    idle = m.get("no_live_worker")
    if not idle:
        return ""
    seconds = idle["last_seen_seconds"]
    if seconds is not None:
        by = "heartbeat" if idle["last_seen_by"] == "heartbeat" else "batch written"
        since = f"a worker last seen {_ago(seconds)} ago (its last {by})"
    else:
        since = f"no worker on record, rows waiting up to {_ago(m['lag_seconds'])}"
    return (
        f"  no sync worker is running: {m['queued']:,} rows queued, {since}; "
        "start one: `pgembed sync`\n"
    )


def _ago(seconds: float) -> str:
    """A duration as a person says it: 45 s, 21 min, 5 h, 3 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def _chunks_text(m: dict[str, Any]) -> str:
    """A chunked model's windows: chunks and rows, and how many windows a row has on average;
    for a model that truncates rows, how to embed all of their text."""
    if m["long_texts"] != "chunk":
        if not m["truncated"]:
            return ""
        return (
            f"  {m['truncated']} rows were cut to their first window: "
            f"`pgembed model alter {m['name']} --long-texts chunk` embeds all of their text\n"
        )
    per_row = (m["chunks"] + m["rows_embedded"]) / max(m["rows_embedded"], 1)
    return (
        f"  chunked: {_n(m, 'chunks')} chunks beside {_n(m, 'rows_embedded')} rows "
        f"({per_row:.2f} vectors per row)\n"
    )


def _n(m: dict[str, Any], field: str) -> str:
    """A count as it is, or an estimate as one: ~1,000,000."""
    return str(m[field]) if m["counts"] == "exact" else f"~{m[field]:,}"


def _index_text(m: dict[str, Any]) -> str:
    """Nothing while the model's HNSW index is built; else what searches do and how to build it.
    A setup not finished says how to finish it instead: that builds the index too."""
    if m["setup"]:
        return (
            f"  setup not finished ({m['setup']}): unless a `pgembed model add {m['name']}` is "
            "running, run it again to finish (queue the rows, build the indexes)\n"
        )
    if m["index"] == "built":
        return ""
    return (
        f"  HNSW index {m['index']}: searches scan the column exactly; "
        f"`pgembed reindex {m['name']} --index-only` builds it (a running `model add "
        "--backfill` builds it once the rows are in)\n"
    )


def _status_text(conn: psycopg.Connection, report: list[dict[str, Any]]) -> str:
    if not report:
        return "no models: add one with `pgembed model add`"
    lines = []
    for m in report:
        if m["broken"]:
            lines.append(_broken_text(m))
            continue
        lines.append(
            f"{m['name']}: {m['model']} ({m['pooling']}, {m['dimensions']}d) on "
            f"{m['table']}.{'+'.join(m['text_columns'])}\n"
            f"  embedded {_n(m, 'rows_embedded')}/{_n(m, 'rows_total')}  queued {m['queued']}  "
            f"lag {m['lag_seconds']:.1f}s  failed {m['failed']}  truncated {m['truncated']}  "
            f"{m['rows_per_second']:.1f} rows/s  workers {len(m['workers'])}\n"
            + _no_worker_text(m)
            + _chunks_text(m)
            + _index_text(m)
            + _estimate_text(m)
            + f"  precision {m['precision']}: {m['precision_note']}"
        )
        if m.get("reindex"):
            lines.append(reindex_line(m["name"], m["reindex"]))
    failed = status.failures(conn)
    if failed:
        lines.append("recent failures (`pgembed retry` requeues them):")
        lines += [
            f"  {f['model']} key={terminal.printable(f['key'])} attempts={f['attempts']}: "
            f"{terminal.printable(f['error'])}"
            for f in failed
        ]
    return "\n".join(lines)


def _estimate_text(m: dict[str, Any]) -> str:
    if m["counts"] == "exact":
        return ""
    return (
        "  ~: estimated from a sample of the table's pages (`pgembed status --exact` counts them)\n"
    )


def _broken_text(m: dict[str, Any]) -> str:
    """A model whose table or column is gone: why, and what is still known."""
    return (
        f"{m['name']}: BROKEN: {m['broken']}\n"
        f"  ({m['model']} on {m['table']}.{'+'.join(m['text_columns'])})  queued {m['queued']}  "
        f"failed {m['failed']}"
    )


def reindex_line(name: str, info: dict[str, Any]) -> str:
    """The `pgembed status` line of a reindex in progress."""
    if info.get("broken"):
        return f"  reindex to version {info['version']} BROKEN: {info['broken']}"
    index = "index built" if info["index_built"] else "index not built yet"
    return (
        f"  reindex to version {info['version']} in progress ({info['model']}, {info['pooling']}, "
        f"{info['dimensions']}d): embedded {_n(info, 'rows_embedded')}/{_n(info, 'rows_total')}  "
        f"queued {info['queued']}  {index}  (`pgembed reindex {name}` finishes it)"
    )
