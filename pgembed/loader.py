"""`pgembed load`: a table from JSON lines or CSV (gzip allowed), to get corpora in for evaluation.

The table is created when missing, with a column per field of the first record, each typed from
the data (bigint, double precision, boolean, date, timestamp, timestamptz when every value of the
column parses as one, else text; `--types` overrides), and the key column as primary key. Rows go
in with COPY through a temporary table and then `INSERT ... ON CONFLICT (key) DO NOTHING`: a
re-load skips keys already there (it never rewrites a row, so it never queues rows for embedding
again), and the whole load is one transaction: a bad line leaves nothing behind.

Memory stays bounded: records stream from the file to COPY one at a time, and a record longer
than defaults.MAX_RECORD_BYTES (a file with no line end, a runaway quoted CSV field) is refused
where it starts, read no further than that.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from pgembed import columntypes, defaults
from pgembed.catalog import naming, tables
from pgembed.columntypes import TEXT, TYPE_NAMES, Record, Value
from pgembed.errors import NotFoundError, UsageError


@dataclass(frozen=True)
class LoadRequest:
    path: Path
    table: str
    key: str | None = None  # default: `_id`, else `id`
    text_columns: tuple[str, ...] = ()  # joined with a space into `into`
    into: str = "text"
    format: str = "auto"  # auto | jsonl | csv
    types: Mapping[str, str] = field(default_factory=dict)  # column -> a TYPE_NAMES name


@dataclass(frozen=True)
class LoadResult:
    table: str
    read: int
    inserted: int
    created: bool
    types: Mapping[str, str] = field(default_factory=dict)  # column -> type, of a created table

    @property
    def skipped(self) -> int:
        return self.read - self.inserted


@contextmanager
def _binary(path: Path) -> Iterator[tuple[io.BufferedIOBase, bool]]:
    """The file's lines as bytes, and whether they are gunzipped (gzip is recognised by its
    magic bytes, whatever the suffix)."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    with f:
        gzipped = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if not gzipped:
            yield f, False
            return
        with gzip.GzipFile(fileobj=f, mode="rb") as unzipped:
            yield unzipped, True


def read_lines(path: Path, limit: int = defaults.MAX_RECORD_BYTES) -> Iterator[str]:
    """The file's lines (line ends kept), decoded; a bad byte, a NUL, a cut gzip or a line longer
    than `limit` bytes is one clear error (a line is never read past `limit`)."""
    with _binary(path) as (f, gzipped):
        offset = 0
        for number in itertools.count(1):
            try:
                raw = f.readline(limit + 1)
            except (EOFError, zlib.error, OSError) as exc:  # gzip.BadGzipFile is an OSError
                what = "the gzip data is truncated or corrupt" if gzipped else "cannot read it"
                raise UsageError(f"{path}: {what} ({exc})") from None
            if not raw:
                return
            if len(raw) > limit:
                raise UsageError(f"{path}:{number}: {too_long(limit)}")
            yield _decoded(path, raw, number, offset, gzipped)
            offset += len(raw)


def too_long(limit: int) -> str:
    return (
        f"a record longer than {limit // 2**20} MiB (a missing line end, an unclosed quote?): "
        "split the text or load it another way"
    )


def _decoded(path: Path, raw: bytes, number: int, offset: int, gzipped: bool) -> str:
    start = len(codecs.BOM_UTF8) if number == 1 and raw.startswith(codecs.BOM_UTF8) else 0
    nul = raw.find(b"\0", start)
    if nul >= 0:
        where = f"byte offset {offset + nul}" + (" unzipped" if gzipped else "")
        raise UsageError(f"{path}:{number}: a NUL byte at {where}: PostgreSQL text cannot hold it")
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[start + exc.start : start + exc.end]
        where = f"byte offset {offset + start + exc.start}" + (" unzipped" if gzipped else "")
        raise UsageError(
            f"{path}:{number}: not valid UTF-8 at {where} ({bad!r}): re-save the file as UTF-8"
        ) from None


def detect_format(path: Path, first_line: str) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffixes and suffixes[-1] == ".csv":
        return "csv"
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def _value(value: object) -> Value:
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    return json.dumps(value)  # nested objects and arrays: their JSON text


def resolve_format(path: Path, fmt: str) -> str:
    """jsonl or csv: as asked, else by the suffix, else by the first line."""
    return detect_format(path, next(read_lines(path), "")) if fmt == "auto" else fmt


def read_records(path: Path, fmt: str) -> Iterator[tuple[int, Record]]:
    """(line number, record) pairs of a jsonl or csv file; CSV empty fields are NULL."""
    lines = read_lines(path)
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
    csv.field_size_limit(2**31 - 1)  # long documents exceed the default 128 KiB; see _Budget
    budget = _Budget(path)
    # strict: a quote never closed (up to the end of the file) or text after a closing quote is
    # an error, not a field that swallowed the rest of the file
    reader = csv.DictReader(budget.lines(lines), strict=True)
    try:
        _ = reader.fieldnames  # reads the header: a row's budget starts after it
        budget.used = 0
        for record in reader:
            budget.used = 0
            if None in record:
                raise UsageError(f"{path}:{reader.line_num}: more fields than the header has")
            yield reader.line_num, {k: v if v != "" else None for k, v in record.items()}
    except csv.Error as exc:
        raise UsageError(f"{path}:{budget.start}: not CSV: {exc}") from None


@dataclass
class _Budget:
    """A CSV row may span lines (a quoted field with line ends): the lines fed to the csv reader
    since the last row it gave, in characters, are its size, bounded like a line's."""

    path: Path
    used: int = 0
    limit: int = defaults.MAX_RECORD_BYTES
    start: int = 1  # the line the current row starts on

    def lines(self, lines: Iterable[str]) -> Iterator[str]:
        for number, line in enumerate(lines, 1):
            if self.used == 0:
                self.start = number
            self.used += len(line)
            if self.used > self.limit:
                raise UsageError(f"{self.path}:{self.start}: {too_long(self.limit)}")
            yield line


def joined(record: Mapping[str, Value], columns: Sequence[str]) -> str:
    """The text of several fields: `" ".join(values).strip()`, a missing or NULL field as ''.

    For BEIR's `title,text` this is exactly `(title + " " + text).strip()`.
    """
    return " ".join(
        "" if record.get(c) is None else columntypes.as_text(record.get(c)) for c in columns
    ).strip()


def infer_types(
    request: LoadRequest, fmt: str, columns: Sequence[str], forced: Mapping[str, str]
) -> dict[str, str]:
    """Each column's type from every record of the file (a first pass, before any write)."""
    typing = columntypes.Typing(request.path, columns, forced, json=fmt == "jsonl")
    for number, record in read_records(request.path, fmt):
        if request.text_columns:
            record = {**record, request.into: joined(record, request.text_columns)}
        typing.see(number, record)
    return typing.result()


def load(
    conn: psycopg.Connection, request: LoadRequest, on_progress: Callable[[int], None] | None = None
) -> LoadResult:
    schema, table = naming.parse_table(request.table)
    into = naming.identifier("column", request.into)
    for column in request.text_columns:
        naming.identifier("text column", column)
    if request.format not in ("auto", "jsonl", "csv"):
        raise UsageError(f"unknown format {request.format!r}: use jsonl or csv")
    fmt = resolve_format(request.path, request.format)
    records = read_records(request.path, fmt)
    first = next(records, None)
    if first is None:
        raise UsageError(f"{request.path} has no records")
    columns = _columns(first[1], request, into)
    key = _key(columns, request.key)
    forced = _forced(request, columns, into)
    with conn.transaction():
        created = not tables.exists(conn, schema, table)
        if created:
            joined_text = {into: TEXT} if request.text_columns else {}
            types = infer_types(request, fmt, columns, forced | joined_text)
            _create(conn, schema, table, types, key)
        info = tables.inspect(conn, schema, table)
        _check_target(info, columns, key, {} if created else forced)
        column_list = sql.SQL(", ").join(map(sql.Identifier, columns))
        target = sql.Identifier(schema, table)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE pgembed_load ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA"
            ).format(column_list, target)
        )
        rows = itertools.chain([first], records)
        read = _copy(conn, columns, key, request, info.columns, rows, on_progress)
        inserted = conn.execute(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT {cols} FROM pgembed_load "
                "ON CONFLICT ({key}) DO NOTHING"
            ).format(target=target, cols=column_list, key=sql.Identifier(key))
        ).rowcount
    shown = {c: info.columns[c] for c in columns} if created else {}
    return LoadResult(f"{schema}.{table}", read, inserted, created, shown)


def _columns(record: Record, request: LoadRequest, into: str) -> list[str]:
    columns = [naming.identifier("column", c) for c in record]
    for column in request.text_columns:
        if column not in columns:
            raise NotFoundError(f"text column {column!r} is not a field of the records")
    if request.text_columns and into not in columns:
        columns.append(into)
    return columns


def _forced(request: LoadRequest, columns: Sequence[str], into: str) -> dict[str, str]:
    """--types as column types (the column that receives joined text can only be text)."""
    forced = {c: TYPE_NAMES[name] for c, name in request.types.items()}
    for column in forced:
        if column not in columns:
            raise NotFoundError(f"--types names {column!r}, which is not a field of the records")
    if request.text_columns and forced.get(into, TEXT) != TEXT:
        raise UsageError(f"--types: column {into!r} receives --text-columns: it is text")
    return forced


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
    conn: psycopg.Connection, schema: str, table: str, types: Mapping[str, str], key: str
) -> None:
    definition = sql.SQL(", ").join(
        # The type is one of TYPE_NAMES' values, never text from the file or the command line.
        sql.SQL("{} {}{}").format(
            sql.Identifier(c), sql.SQL(t), sql.SQL(" PRIMARY KEY" if c == key else "")
        )
        for c, t in types.items()
    )
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(schema, table), definition))


def _check_target(
    info: tables.TableInfo, columns: Sequence[str], key: str, forced: Mapping[str, str]
) -> None:
    for column in columns:
        tables.require_column(info, column)
    if key not in info.unique_columns:
        raise UsageError(
            f"key column {key!r} of {info.schema}.{info.name} is not unique: "
            "a re-load could not tell new rows from old"
        )
    for column, wanted in forced.items():
        if info.columns[column] != wanted:
            raise UsageError(
                f"--types asks {column!r} to be {wanted}, but {info.schema}.{info.name} "
                f"has it as {info.columns[column]}"
            )


def _copy(
    conn: psycopg.Connection,
    columns: Sequence[str],
    key: str,
    request: LoadRequest,
    types: Mapping[str, str],
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
            copy.write_row([columntypes.cell(record.get(c), types[c]) for c in columns])
            read += 1
            if on_progress is not None and read % 1000 == 0:
                on_progress(1000)
    if on_progress is not None:
        on_progress(read % 1000)
    return read
