"""Reading uploaded files (JSONL, CSV, Parquet) as a stream of records, for every importer.

Each reader yields `Record`s one row at a time, so a file of any length is read in constant memory,
and raises every problem as a `FileImportError` naming the file, the line (or Parquet row) and what
is wrong. What a record means (a task, an experience) is the importer's business
(apps.tasksets.importers, apps.buffer.importers). Nothing here touches the database.
"""

import csv
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow
import pyarrow.compute as pc
import pyarrow.parquet as pq

from workers.rft.json_values import text_problem

from .jobs import JobError

FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
PARQUET_BATCH_ROWS = 2_000
UTF8_BOM = b"\xef\xbb\xbf"


class FileImportError(JobError):
    """A file that cannot be imported. `line` is the 1-based line (JSONL, CSV) or data row (Parquet,
    `unit="row"`), or None when the problem is the file as a whole. A job that meets one fails with
    its message."""

    def __init__(self, file: str, line: int | None, message: str, *, unit: str = "line"):
        self.file, self.line, self.message, self.unit = file, line, message, unit
        where = file if line is None else f"{file}, {unit} {line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class ReadProgress:
    """Where the reader is after the last row it yielded."""

    bytes_read: int
    bytes_total: int


class Record(NamedTuple):
    """One row of a file: where it is (`location` in `unit`s: "line" or "row"), its fields, and
    how far through the file the reader is."""

    location: int
    unit: str
    fields: dict
    progress: ReadProgress


def detect_format(filename: str, formats: tuple[str, ...], what: str) -> str:
    """The format of `filename` by its extension, one of `formats`: those the importer of `what`
    (expert data, a taskset) reads. Each importer's FORMATS is the one list of what it accepts,
    so the error names only extensions that importer would take."""
    fmt = FORMAT_BY_EXTENSION.get(Path(filename).suffix.lower())
    if fmt in formats:
        return fmt
    accepted = ", ".join(extensions(formats))
    if fmt is None:
        message = f"unknown format: cannot tell it from the extension ({what} is read from {accepted})"
    else:
        message = f"{fmt.upper()} files cannot hold {what}: use {accepted}"
    raise FileImportError(Path(filename).name, None, message)


def extensions(formats: tuple[str, ...]) -> list[str]:
    """The file extensions of `formats`, in the order FORMAT_BY_EXTENSION lists them."""
    return [extension for extension, fmt in FORMAT_BY_EXTENSION.items() if fmt in formats]


def read_jsonl(path: Path, name: str, max_line_bytes: int) -> Iterator[Record]:
    """Each JSON object of a JSONL file (blank lines skipped)."""
    lines = _Lines(path, name, max_line_bytes)
    for line in lines:
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except json.JSONDecodeError as exc:
            raise FileImportError(name, lines.number, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        except ValueError as exc:
            raise FileImportError(name, lines.number, str(exc)) from None
        if not isinstance(record, dict):
            raise FileImportError(name, lines.number, f"expected a JSON object, got {json_type(record)}")
        yield Record(lines.number, "line", record, lines.progress())


def read_csv(path: Path, name: str, columns: list[str], max_line_bytes: int) -> Iterator[Record]:
    """Each row of a CSV file as a dict by its header, which must name every one of `columns`."""
    # The csv module's per-field cap (128 KiB by default) is process-wide; raise it to the line cap
    # so a long prompt that fits in a line is not rejected by a second, stricter limit.
    csv.field_size_limit(max(csv.field_size_limit(), max_line_bytes))
    lines = _Lines(path, name, max_line_bytes)
    header = None
    try:
        for values in csv.reader(lines):
            if not values:
                continue  # a blank line
            if header is None:
                header = values
                twice = sorted({column for column in header if header.count(column) > 1})
                if twice:  # dict(zip()) kept the last of them, without a word
                    raise FileImportError(name, lines.number, f"the header names {quoted(twice)} more than once")
                missing = [c for c in columns if c not in header]
                if missing:
                    raise FileImportError(
                        name,
                        lines.number,
                        f"no column {quoted(missing)} in the header (columns: {', '.join(header)})"
                        + _separator_hint(header),
                    )
                continue
            if len(values) != len(header):
                raise FileImportError(
                    name, lines.number, f"ragged row: {len(values)} fields where the header has {len(header)}"
                )
            yield Record(lines.number, "line", dict(zip(header, values, strict=True)), lines.progress())
    except csv.Error as exc:
        raise FileImportError(name, lines.number, f"malformed CSV: {exc}") from None


def _separator_hint(header: list[str]) -> str:
    """A header read as one column that another separator would split (Excel writes ';' where the
    decimal mark is a comma)."""
    other = next((sep for sep in (";", "\t", "|") if len(header) == 1 and sep in header[0]), None)
    shown = {"\t": "tabs"}.get(other, repr(other))
    return "" if other is None else f"; the header is one column: is the file separated by {shown}? CSV here is " \
        "comma-separated (save it as 'CSV UTF-8 (comma delimited)', or as JSONL)"


def read_parquet(path: Path, name: str, columns: list[str], max_line_bytes: int) -> Iterator[Record]:
    """Each row of a Parquet file, reading only `columns` (which it must have)."""
    total = path.stat().st_size
    try:
        metadata = pq.read_metadata(path)
        # Text stored once in a dictionary page stays one value in memory, however many cells
        # repeat it, until its size has been checked.
        parquet = pq.ParquetFile(path, metadata=metadata, read_dictionary=_dictionary_encoded_text(metadata))
    except (pyarrow.ArrowException, OSError) as exc:
        raise FileImportError(name, None, f"not a readable Parquet file ({exc})") from None
    with parquet:
        present = parquet.schema_arrow.names
        missing = [c for c in columns if c not in present]
        if missing:
            raise FileImportError(name, None, f"no column {quoted(missing)} (columns: {', '.join(present)})")
        total_rows = parquet.metadata.num_rows
        _check_row_group_sizes(parquet.metadata, columns, name, max_line_bytes)
        row_number = 0
        try:
            # Only `columns` are read, one batch at a time.
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                _check_cell_sizes(batch, row_number, name, max_line_bytes)
                for record in batch.to_pylist():
                    row_number += 1
                    # Parquet is read column by column, so there is no byte position to report;
                    # the share of rows read stands in for it.
                    read = ReadProgress(total * row_number // max(total_rows, 1), total)
                    yield Record(row_number, "row", record, read)
        except pyarrow.ArrowException as exc:
            raise FileImportError(name, row_number + 1, f"unreadable Parquet data ({exc})", unit="row") from None


# A JSONL or CSV line holds at most `max_line_bytes`, and so does each of its cells. Parquet has no
# lines, and compresses a huge repeated value to almost nothing, so each of its cells is held to the
# same limit: first from the row groups' metadata, before anything is decompressed, then exactly,
# cell by cell, on each batch before its values become Python objects.


def _dictionary_encoded_text(metadata) -> list[str]:
    """The top-level text columns that some row group stores as a dictionary. (Arrow cannot read
    nested columns as dictionaries across row groups: a chat prompt's repeated text is expanded
    before its size is checked, though never imported.)"""
    columns = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for leaf in range(row_group.num_columns):
            chunk = row_group.column(leaf)
            if chunk.physical_type == "BYTE_ARRAY" and chunk.has_dictionary_page and "." not in chunk.path_in_schema:
                columns.add(chunk.path_in_schema)
    return sorted(columns)


def _check_row_group_sizes(metadata, columns: list[str], name: str, limit: int) -> None:
    """Refuse a row group in which some mapped column holds more than `limit` bytes a row: one of
    its cells must be over the limit. A file that understates its sizes is caught per batch."""
    first_row = 1
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        sizes = dict.fromkeys(columns, 0)
        for leaf in range(row_group.num_columns):
            chunk = row_group.column(leaf)
            column = chunk.path_in_schema.split(".", 1)[0]  # a nested column has one chunk per leaf
            if column in sizes:
                sizes[column] += chunk.total_uncompressed_size
        rows = row_group.num_rows
        for column, size in sizes.items():
            if size > limit * max(rows, 1):
                if rows == 1:
                    raise FileImportError(
                        name, first_row, f"column {column!r} holds {size:,} bytes uncompressed, over the limit "
                        f"of {limit:,} bytes", unit="row",
                    )
                raise FileImportError(
                    name,
                    None,
                    f"rows {first_row:,}-{first_row + rows - 1:,}: column {column!r} holds {size:,} bytes "
                    f"uncompressed for {rows:,} rows, so a cell is over the limit of {limit:,} bytes",
                )
        first_row += rows


def _check_cell_sizes(batch: pyarrow.RecordBatch, rows_before: int, name: str, limit: int) -> None:
    for column, values in zip(batch.schema.names, batch.columns, strict=True):
        if values.nbytes <= limit:
            continue  # the whole column of the batch fits: so does each of its cells
        sizes = _cell_bytes(values)
        over = (sizes > limit).nonzero()[0]
        if len(over):
            index = int(over[0])
            raise FileImportError(
                name,
                rows_before + index + 1,
                f"column {column!r} is {int(sizes[index]):,} bytes, over the limit of {limit:,} bytes",
                unit="row",
            )


def _cell_bytes(values: pyarrow.Array) -> np.ndarray:
    """The bytes of each cell's values (text, and 8 bytes a number), computed column-wise: nothing
    becomes a Python object, and a dictionary value repeated in many cells counts in each."""
    kind = values.type
    if pyarrow.types.is_dictionary(kind):
        if len(values.dictionary) == 0:  # every cell null
            return np.zeros(len(values), dtype=np.int64)
        return _cell_bytes(values.dictionary)[values.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    if pyarrow.types.is_string(kind) or pyarrow.types.is_binary(kind) or pyarrow.types.is_large_string(kind) \
            or pyarrow.types.is_large_binary(kind):
        return pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pyarrow.types.is_list(kind) or pyarrow.types.is_large_list(kind) or pyarrow.types.is_map(kind):
        offsets = values.offsets.to_numpy(zero_copy_only=False)  # into the whole child array
        running = np.concatenate(([0], np.cumsum(_cell_bytes(values.values))))
        return running[offsets[1:]] - running[offsets[:-1]]
    if pyarrow.types.is_struct(kind):
        return sum((_cell_bytes(field) for field in values.flatten()), np.zeros(len(values), dtype=np.int64))
    return np.full(len(values), 8, dtype=np.int64)  # numbers, booleans, dates: small and fixed


class _Lines:
    """The decoded lines of a UTF-8 file, remembering the current line number and byte offset.

    Lines are read in binary with a bounded `readline`, so a huge line costs at most
    `max_line_bytes` of memory before it is rejected, and a decoding error can name its line and
    byte offset (a text-mode file would only report a position inside its read buffer). Iterating
    yields text with its line ending, which is what csv.reader expects."""

    def __init__(self, path: Path, name: str, max_line_bytes: int):
        self.path, self.name, self.max_line_bytes = path, name, max_line_bytes
        self.total = path.stat().st_size
        self.number = 0  # of the line last read
        self.offset = 0  # bytes read so far

    def progress(self) -> ReadProgress:
        return ReadProgress(self.offset, self.total)

    def __iter__(self) -> Iterator[str]:
        with open(self.path, "rb") as file:
            while line := file.readline(self.max_line_bytes + 1):
                self.number += 1
                if len(line) > self.max_line_bytes and not line.endswith(b"\n"):
                    size = len(line) + _skip_rest_of_line(file, self.max_line_bytes)
                    raise FileImportError(
                        self.name,
                        self.number,
                        f"line is {size:,} bytes, over the limit of {self.max_line_bytes:,} bytes",
                    )
                decoded = self._decode(line)
                self.offset += len(line)
                yield decoded

    def _decode(self, line: bytes) -> str:
        bom = len(UTF8_BOM) if self.number == 1 and line.startswith(UTF8_BOM) else 0
        try:
            return line[bom:].decode("utf-8")
        except UnicodeDecodeError as exc:
            position = bom + exc.start
            raise FileImportError(
                self.name,
                self.number,
                f"not valid UTF-8: byte 0x{line[position]:02x} at byte offset {self.offset + position:,} of the file "
                f"(byte {position + 1} of the line); save the file as UTF-8",
            ) from None


def _skip_rest_of_line(file, chunk_bytes: int) -> int:
    """Read to the end of the current line in bounded chunks; return how many bytes that was."""
    skipped = 0
    while chunk := file.readline(chunk_bytes):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


# ---- values ----

# How deep JSON from a file may nest. A task or an experience needs a few levels (a chat prompt is
# 3); Python recursion (json itself, json_value, the pages that show a value) fails a few hundred
# levels down, which a file must not reach.
MAX_JSON_DEPTH = 64


def parse_json(text: str):
    """json.loads, but a value nested deeper than MAX_JSON_DEPTH is a ValueError saying so
    (json.JSONDecodeError, a ValueError too, for text that is not JSON)."""
    too_deep = ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except RecursionError:  # thousands of levels: json's own recursion gave up
        raise too_deep from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # json's only other one: Python's, for a whole number it will not read
        raise ValueError(_long_number(text) or str(exc)) from None
    depth, level = 0, [value]  # the containers at one depth, looked at level by level (no recursion)
    while level := [item for item in level if isinstance(item, (dict, list))]:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise too_deep
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else item)]
    return value


class _LongNumber:
    """Where json read a whole number of more digits than Python converts (a 5,000-digit one failed
    with "Exceeds the limit (4300 digits) for integer string conversion ... use
    sys.set_int_max_str_digits()", which named neither the field nor a way out)."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def _long_number(text: str) -> str | None:
    """What is wrong with the first whole number of text too long to read, naming where it is. Only
    read again once json refused the text: the hook is called for every integer (a token-id array of
    an exported experience holds thousands)."""
    limit = sys.get_int_max_str_digits()
    value = json.loads(text, parse_int=lambda digits: _LongNumber(digits)
                       if len(digits.lstrip("-")) > limit else int(digits))
    found = [("", value)]
    while found:
        path, item = found.pop()
        if isinstance(item, _LongNumber):
            where = f"{path.removeprefix('.')!r} is" if path else "the value is"
            return (f"{where} a whole number of {item.digits:,} digits; at most {limit:,} are read "
                    "(write it as a string to keep it)")
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        found.extend((f"{path}[{key}]" if isinstance(item, list) else f"{path}.{key}", child)
                     for key, child in reversed(list(children)))
    return None


def json_value(value):
    """Parquet can hold values JSON cannot (dates, decimals, bytes); store those as text."""
    if isinstance(value, str):
        return text(value, "a metadata or message value")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {text(str(k), "a metadata key"): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def text(value: str, what: str) -> str:
    """`value`, or ValueError if the database cannot store it: Postgres text and jsonb hold neither
    a NUL nor a lone surrogate (SQLite took both, and the same file failed on Postgres with its SQL)."""
    if problem := text_problem(value):
        raise ValueError(f"{what} {problem}, which the database cannot store")
    return value


def json_type(value) -> str:
    names = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def quoted(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
