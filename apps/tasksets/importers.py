"""Read taskset files (JSONL, CSV, Parquet) as a stream of task fields.

Nothing here touches the database: `read_tasks` turns a file and a `FieldMapping` into `TaskFields`
one row at a time, so a file of any length is read in constant memory, and every problem is raised
as a `TasksetImportError` that names the file, the line (or Parquet row) and what is wrong.
"""

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.compute as pc
import pyarrow.parquet as pq

FORMATS = ("jsonl", "csv", "parquet")
FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
DEFAULT_MAX_LINE_BYTES = 1024 * 1024
PARQUET_BATCH_ROWS = 2_000
UTF8_BOM = b"\xef\xbb\xbf"


class TasksetImportError(Exception):
    """A file that cannot be imported. `line` is the 1-based line (JSONL, CSV) or data row (Parquet,
    `unit="row"`), or None when the problem is the file as a whole."""

    def __init__(self, file: str, line: int | None, message: str, *, unit: str = "line"):
        self.file, self.line, self.message, self.unit = file, line, message, unit
        where = file if line is None else f"{file}, {unit} {line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class FieldMapping:
    """Which column (CSV, Parquet) or key (JSONL) of the file becomes which task field."""

    prompt: str
    answer: str
    metadata: tuple[str, ...] = ()
    difficulty: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "metadata", tuple(self.metadata))

    @property
    def columns(self) -> list[str]:
        names = [self.prompt, self.answer, *self.metadata]
        if self.difficulty:
            names.append(self.difficulty)
        return list(dict.fromkeys(names))

    def to_dict(self) -> dict:
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "metadata": list(self.metadata),
            "difficulty": self.difficulty,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "FieldMapping":
        return cls(data["prompt"], data["answer"], tuple(data.get("metadata") or ()), data.get("difficulty") or None)


@dataclass
class TaskFields:
    prompt: str | list[dict]
    answer: str
    metadata: dict = field(default_factory=dict)
    difficulty: float = 0.0


@dataclass(frozen=True)
class ReadProgress:
    """Where the reader is after the last row it yielded."""

    bytes_read: int
    bytes_total: int


def detect_format(filename: str) -> str:
    fmt = FORMAT_BY_EXTENSION.get(Path(filename).suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(FORMAT_BY_EXTENSION))
        raise TasksetImportError(
            Path(filename).name, None, f"unknown format: cannot tell it from the extension (known: {known})"
        )
    return fmt


def read_tasks(
    path: Path,
    fmt: str,
    mapping: FieldMapping,
    *,
    display_name: str | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Iterator[tuple[TaskFields, ReadProgress]]:
    """Yield (task fields, progress) for each row of the file, in order. Raises TasksetImportError."""
    name = display_name or Path(path).name
    if fmt not in FORMATS:
        raise TasksetImportError(name, None, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if not Path(path).is_file():
        raise TasksetImportError(name, None, f"no such file: {path}")
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet}
    rows = 0
    for location, unit, record, progress in readers[fmt](Path(path), name, mapping, max_line_bytes):
        try:
            task = _task_fields(record, mapping)
        except ValueError as exc:
            raise TasksetImportError(name, location, str(exc), unit=unit) from None
        rows += 1
        yield task, progress
    if rows == 0:
        raise TasksetImportError(name, None, "the file has no rows")


# ---- formats: each yields (line or row number, unit, record dict, progress) ----


def _read_jsonl(path: Path, name: str, mapping: FieldMapping, max_line_bytes: int):
    lines = _Lines(path, name, max_line_bytes)
    for text in lines:
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TasksetImportError(name, lines.number, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(record, dict):
            raise TasksetImportError(name, lines.number, f"expected a JSON object, got {_json_type(record)}")
        yield lines.number, "line", record, lines.progress()


def _read_csv(path: Path, name: str, mapping: FieldMapping, max_line_bytes: int):
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
                missing = [c for c in mapping.columns if c not in header]
                if missing:
                    raise TasksetImportError(
                        name, lines.number, f"no column {_names(missing)} in the header (columns: {', '.join(header)})"
                    )
                continue
            if len(values) != len(header):
                raise TasksetImportError(
                    name, lines.number, f"ragged row: {len(values)} fields where the header has {len(header)}"
                )
            yield lines.number, "line", dict(zip(header, values, strict=True)), lines.progress()
    except csv.Error as exc:
        raise TasksetImportError(name, lines.number, f"malformed CSV: {exc}") from None


def _read_parquet(path: Path, name: str, mapping: FieldMapping, max_line_bytes: int):
    total = path.stat().st_size
    try:
        metadata = pq.read_metadata(path)
        # Text stored once in a dictionary page stays one value in memory, however many cells
        # repeat it, until its size has been checked.
        parquet = pq.ParquetFile(path, metadata=metadata, read_dictionary=_dictionary_encoded_text(metadata))
    except (pyarrow.ArrowException, OSError) as exc:
        raise TasksetImportError(name, None, f"not a readable Parquet file ({exc})") from None
    with parquet:
        columns = parquet.schema_arrow.names
        missing = [c for c in mapping.columns if c not in columns]
        if missing:
            raise TasksetImportError(name, None, f"no column {_names(missing)} (columns: {', '.join(columns)})")
        total_rows = parquet.metadata.num_rows
        _check_row_group_sizes(parquet.metadata, mapping.columns, name, max_line_bytes)
        row_number = 0
        try:
            # Only the mapped columns are read, one batch at a time.
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=mapping.columns):
                _check_cell_sizes(batch, row_number, name, max_line_bytes)
                for record in batch.to_pylist():
                    row_number += 1
                    # Parquet is read column by column, so there is no byte position to report;
                    # the share of rows read stands in for it.
                    yield row_number, "row", record, ReadProgress(total * row_number // max(total_rows, 1), total)
        except pyarrow.ArrowException as exc:
            raise TasksetImportError(name, row_number + 1, f"unreadable Parquet data ({exc})", unit="row") from None


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
                    raise TasksetImportError(
                        name, first_row, f"column {column!r} holds {size:,} bytes uncompressed, over the limit "
                        f"of {limit:,} bytes", unit="row",
                    )
                raise TasksetImportError(
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
            raise TasksetImportError(
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
                    raise TasksetImportError(
                        self.name,
                        self.number,
                        f"line is {size:,} bytes, over the limit of {self.max_line_bytes:,} bytes",
                    )
                text = self._decode(line)
                self.offset += len(line)
                yield text

    def _decode(self, line: bytes) -> str:
        bom = len(UTF8_BOM) if self.number == 1 and line.startswith(UTF8_BOM) else 0
        try:
            return line[bom:].decode("utf-8")
        except UnicodeDecodeError as exc:
            position = bom + exc.start
            raise TasksetImportError(
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


# ---- one record -> task fields ----


def _task_fields(record: dict, mapping: FieldMapping) -> TaskFields:
    """Raises ValueError with a message naming the field and the problem."""
    missing = [c for c in mapping.columns if c not in record]
    if missing:
        raise ValueError(f"missing {'field' if len(missing) == 1 else 'fields'} {_names(missing)}")
    task = TaskFields(
        prompt=_prompt(record[mapping.prompt], mapping.prompt),
        answer=_answer(record[mapping.answer], mapping.answer),
        metadata={key: _json_value(record[key]) for key in mapping.metadata},
    )
    if mapping.difficulty:
        task.difficulty = _difficulty(record[mapping.difficulty], mapping.difficulty)
    return task


def _prompt(value, key: str) -> str | list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"prompt {key!r} is empty")
        return _text(value, f"prompt {key!r}")
    if isinstance(value, list) and value:
        for number, message in enumerate(value, 1):
            if not isinstance(message, dict):
                raise ValueError(
                    f"prompt {key!r}: message {number} is {_json_type(message)}, not a {{role, content}} object"
                )
            for part in ("role", "content"):
                if not isinstance(message.get(part), str):
                    raise ValueError(f"prompt {key!r}: message {number} has no string {part!r}")
        return [{k: _json_value(v) for k, v in message.items()} for message in value]
    raise ValueError(
        f"prompt {key!r} must be a non-empty string or a list of chat messages {{role, content}}, "
        f"got {_json_type(value)}"
    )


def _answer(value, key: str) -> str:
    if value is None:
        raise ValueError(f"answer {key!r} is null")
    if isinstance(value, str):
        return _text(value, f"answer {key!r}")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)  # escapes any NUL
    return str(value)  # numbers and booleans: GSM8K-style files store answers as numbers


def _difficulty(value, key: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"difficulty {key!r} is {value!r}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"difficulty {key!r} is {value!r}, not a finite number")
    return number


def _json_value(value):
    """Parquet can hold values JSON cannot (dates, decimals, bytes); store those as text."""
    if isinstance(value, str):
        return _text(value, "a metadata or message value")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


def _text(value: str, what: str) -> str:
    if "\x00" in value:  # Postgres text and jsonb cannot hold it
        raise ValueError(f"{what} contains a NUL character (\\x00), which the database cannot store")
    return value


def _json_type(value) -> str:
    names = {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
