"""Read taskset files (JSONL, CSV, Parquet) as a stream of task fields.

Nothing here touches the database: `read_tasks` turns a file and a `FieldMapping` into `TaskFields`
one row at a time (the file is read by apps.core.files, in constant memory), and every problem is
raised as a `FileImportError` that names the file, the line (or Parquet row) and what is wrong.
"""

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from apps.core.files import (
    FileImportError,
    ReadProgress,
    detect_format,
    json_type,
    json_value,
    quoted,
    read_csv,
    read_jsonl,
    read_parquet,
    text,
)

FORMATS = ("jsonl", "csv", "parquet")
DEFAULT_MAX_LINE_BYTES = 1024 * 1024


def detect_task_format(filename: str) -> str:
    return detect_format(filename, FORMATS, "a taskset")


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


def read_tasks(
    path: Path,
    fmt: str,
    mapping: FieldMapping,
    *,
    display_name: str | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Iterator[tuple[TaskFields, ReadProgress]]:
    """Yield (task fields, progress) for each row of the file, in order. Raises FileImportError."""
    path = Path(path)
    name = display_name or path.name
    if fmt not in FORMATS:
        raise FileImportError(name, None, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if not path.is_file():
        raise FileImportError(name, None, f"no such file: {path}")
    if fmt == "jsonl":
        records = read_jsonl(path, name, max_line_bytes)
    else:
        records = {"csv": read_csv, "parquet": read_parquet}[fmt](path, name, mapping.columns, max_line_bytes)
    rows = 0
    for location, unit, record, progress in records:
        try:
            task = _task_fields(record, mapping)
        except ValueError as exc:
            raise FileImportError(name, location, str(exc), unit=unit) from None
        rows += 1
        yield task, progress
    if rows == 0:
        raise FileImportError(name, None, "the file has no rows")


# ---- one record -> task fields ----


def _task_fields(record: dict, mapping: FieldMapping) -> TaskFields:
    """Raises ValueError with a message naming the field and the problem."""
    missing = [c for c in mapping.columns if c not in record]
    if missing:
        raise ValueError(f"missing {'field' if len(missing) == 1 else 'fields'} {quoted(missing)}")
    task = TaskFields(
        prompt=_prompt(record[mapping.prompt], mapping.prompt),
        answer=_answer(record[mapping.answer], mapping.answer),
        metadata={key: json_value(record[key]) for key in mapping.metadata},
    )
    if mapping.difficulty:
        task.difficulty = _difficulty(record[mapping.difficulty], mapping.difficulty)
    return task


def _prompt(value, key: str) -> str | list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"prompt {key!r} is empty")
        return text(value, f"prompt {key!r}")
    if isinstance(value, list) and value:
        for number, message in enumerate(value, 1):
            if not isinstance(message, dict):
                raise ValueError(
                    f"prompt {key!r}: message {number} is {json_type(message)}, not a {{role, content}} object"
                )
            for part in ("role", "content"):
                if not isinstance(message.get(part), str):
                    raise ValueError(f"prompt {key!r}: message {number} has no string {part!r}")
        return [{k: json_value(v) for k, v in message.items()} for message in value]
    raise ValueError(
        f"prompt {key!r} must be a non-empty string or a list of chat messages {{role, content}}, "
        f"got {json_type(value)}"
    )


def _answer(value, key: str) -> str:
    if value is None:
        raise ValueError(f"answer {key!r} is null")
    if isinstance(value, str):
        return text(value, f"answer {key!r}")
    if not isinstance(value, (bool, int, float, dict, list)):  # a Parquet date or decimal: its text
        return str(value)
    # Anything else as JSON writes it (GSM8K-style files store answers as numbers): Python's str()
    # stored `true` as "True", which exact_match compares as text and no reply writes.
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)  # escapes any NUL
    except ValueError:  # json reads 1e999 as infinity and takes NaN: stored as "inf" and "nan", matched by nothing
        what = "is" if isinstance(value, float) else "holds a number that is"
        raise ValueError(f"answer {key!r} {what} not finite (NaN, Infinity, or too large for a float, as 1e999 is): "
                         "write it as a string if it is text") from None


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
