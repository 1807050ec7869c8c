"""`pgembed load`: a table from JSON lines or CSV (gzip allowed), to get corpora in for evaluation.

The table is created when missing, with a `text` column per field of the first record and the key
column as primary key. Rows go in with COPY through a temporary table and then
`INSERT ... ON CONFLICT (key) DO NOTHING`: a re-load skips keys already there (it never rewrites a
row, so it never queues rows for embedding again), and the whole load is one transaction.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg import sql

from pgembed.catalog import naming, tables
from pgembed.errors import NotFoundError, UsageError

Record = dict[str, str | None]


@dataclass(frozen=True)
class LoadRequest:
    path: Path
    table: str
    key: str | None = None  # default: `_id`, else `id`
    text_columns: tuple[str, ...] = ()  # joined with a space into `into`
    into: str = "text"
    format: str = "auto"  # auto | jsonl | csv


@dataclass(frozen=True)
class LoadResult:
    table: str
    read: int
    inserted: int
    created: bool

    @property
    def skipped(self) -> int:
        return self.read - self.inserted


def open_text(path: Path) -> TextIO:
    """The file as text; gzip is recognised by its magic bytes, whatever the suffix."""
    try:
        with path.open("rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        if gzipped:
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
        return path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def detect_format(path: Path, first_line: str) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffixes and suffixes[-1] == ".csv":
        return "csv"
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def _value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)  # numbers, booleans, nested objects: their JSON text


def read_records(path: Path, fmt: str) -> Iterator[tuple[int, Record]]:
    """(line number, record) pairs; CSV empty fields are NULL."""
    with open_text(path) as f:
        first = f.readline()
        lines = itertools.chain([first], f)
        fmt = detect_format(path, first) if fmt == "auto" else fmt
        yield from (_jsonl(path, lines) if fmt == "jsonl" else _csv(path, lines))


def _jsonl(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, Record]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number}: expected a JSON object")
        yield number, {str(k): _value(v) for k, v in record.items()}


def _csv(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, Record]]:
    csv.field_size_limit(2**31 - 1)  # long documents exceed the default 128 KiB
    reader = csv.DictReader(lines)
    for record in reader:
        if None in record:
            raise UsageError(f"{path}:{reader.line_num}: more fields than the header has")
        yield reader.line_num, {k: v if v != "" else None for k, v in record.items()}


def joined(record: Record, columns: Sequence[str]) -> str:
    """The text of several fields: `" ".join(values).strip()`, a missing or NULL field as ''.

    For BEIR's `title,text` this is exactly `(title + " " + text).strip()`.
    """
    return " ".join(record.get(c) or "" for c in columns).strip()


def load(
    conn: psycopg.Connection, request: LoadRequest, on_progress: Callable[[int], None] | None = None
) -> LoadResult:
    schema, table = naming.parse_table(request.table)
    into = naming.identifier("column", request.into)
    for column in request.text_columns:
        naming.identifier("text column", column)
    if request.format not in ("auto", "jsonl", "csv"):
        raise UsageError(f"unknown format {request.format!r}: use jsonl or csv")
    records = read_records(request.path, request.format)
    first = next(records, None)
    if first is None:
        raise UsageError(f"{request.path} has no records")
    columns = _columns(first[1], request, into)
    key = _key(columns, request.key)
    with conn.transaction():
        created = _create(conn, schema, table, columns, key)
        target = sql.Identifier(schema, table)
        _check_target(conn, schema, table, columns, key)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE pgembed_load ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA"
            ).format(sql.SQL(", ").join(map(sql.Identifier, columns)), target)
        )
        read = _copy(conn, columns, key, request, itertools.chain([first], records), on_progress)
        column_list = sql.SQL(", ").join(map(sql.Identifier, columns))
        inserted = conn.execute(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT {cols} FROM pgembed_load "
                "ON CONFLICT ({key}) DO NOTHING"
            ).format(target=target, cols=column_list, key=sql.Identifier(key))
        ).rowcount
    return LoadResult(f"{schema}.{table}", read, inserted, created)


def _columns(record: Record, request: LoadRequest, into: str) -> list[str]:
    columns = [naming.identifier("column", c) for c in record]
    for column in request.text_columns:
        if column not in columns:
            raise NotFoundError(f"text column {column!r} is not a field of the records")
    if request.text_columns and into not in columns:
        columns.append(into)
    return columns


def _key(columns: Sequence[str], requested: str | None) -> str:
    if requested is not None:
        key = naming.identifier("key column", requested)
        if key not in columns:
            raise NotFoundError(f"key column {key!r} is not a field of the records")
        return key
    for candidate in ("_id", "id"):
        if candidate in columns:
            return candidate
    raise UsageError("the records have no `_id` or `id` field: name the key column with --key")


def _create(
    conn: psycopg.Connection, schema: str, table: str, columns: Sequence[str], key: str
) -> bool:
    if tables.exists(conn, schema, table):
        return False
    definition = sql.SQL(", ").join(
        sql.SQL("{} text{}").format(sql.Identifier(c), sql.SQL(" PRIMARY KEY" if c == key else ""))
        for c in columns
    )
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(schema, table), definition))
    return True


def _check_target(
    conn: psycopg.Connection, schema: str, table: str, columns: Sequence[str], key: str
) -> None:
    info = tables.inspect(conn, schema, table)
    for column in columns:
        tables.require_column(info, column)
    if key not in info.unique_columns:
        raise UsageError(
            f"key column {key!r} of {schema}.{table} is not unique: "
            "a re-load could not tell new rows from old"
        )


def _copy(
    conn: psycopg.Connection,
    columns: Sequence[str],
    key: str,
    request: LoadRequest,
    records: Iterator[tuple[int, Record]],
    on_progress: Callable[[int], None] | None,
) -> int:
    known = set(columns)
    read = 0
    statement = sql.SQL("COPY pgembed_load ({}) FROM STDIN").format(
        sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    with conn.cursor() as cur, cur.copy(statement) as copy:
        for number, record in records:
            extra = record.keys() - known
            if extra:
                raise UsageError(
                    f"{request.path}:{number}: field {sorted(extra)[0]!r} is not a column"
                )
            if request.text_columns:
                record = {**record, request.into: joined(record, request.text_columns)}
            if record.get(key) is None:
                raise UsageError(f"{request.path}:{number}: no value for the key {key!r}")
            copy.write_row([record.get(c) for c in columns])
            read += 1
            if on_progress is not None and read % 1000 == 0:
                on_progress(1000)
    if on_progress is not None:
        on_progress(read % 1000)
    return read
