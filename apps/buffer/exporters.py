"""Write experiences and feedback to JSONL or Parquet, one chunk of rows at a time; see docs/data-formats.md.

A writer holds one chunk in memory at most: JSONL is written line by line, Parquet one row group
a chunk, so an export of any size runs in flat memory. An experience export is also an SFT
import file (`prompt`, `response`, token arrays, rewards), so exported data imports back as is.
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = ("jsonl", "parquet")
# Parquet has no type for arbitrary JSON: these columns hold JSON text there (native JSON in JSONL).
JSON_COLUMNS = {"messages", "reward_components", "metadata"}

EXPERIENCE_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("run", pa.int64()),
        ("task", pa.int64()),
        ("parent", pa.int64()),
        ("source", pa.string()),
        ("status", pa.string()),
        ("explorer_step", pa.int64()),
        ("group_id", pa.string()),
        ("rollout_index", pa.int64()),
        ("model_version", pa.int64()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("messages", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("action_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("reward_components", pa.string()),
        ("advantage", pa.float64()),
        ("priority", pa.float64()),
        ("use_count", pa.int64()),
        ("metadata", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)

FEEDBACK_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("experience", pa.int64()),
        ("other", pa.int64()),
        ("user", pa.string()),
        ("kind", pa.string()),
        ("value", pa.float64()),
        ("label", pa.string()),
        ("edited_text", pa.string()),
        ("comment", pa.string()),
        ("seconds_spent", pa.float64()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        # Set on the rows that are DPO pairs only, so an export of those is a DPO import file.
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def experience_record(row) -> dict:
    """One experience as an export row; `row` is a buffer.Experience."""
    return {
        "id": row.pk,
        "run": row.run_id,
        "task": row.task_id,
        "parent": row.parent_id,
        "source": row.source,
        "status": row.status,
        "explorer_step": row.explorer_step,
        "group_id": row.group_id,
        "rollout_index": row.rollout_index,
        "model_version": row.model_version,
        "prompt": row.prompt_text,
        "response": row.response_text,
        "messages": row.messages,
        "prompt_ids": row.prompt_ids,
        "response_ids": row.response_ids,
        "action_mask": row.action_mask,
        "logprobs": row.logprobs,
        "reward": row.reward,
        "reward_components": row.reward_components,
        "advantage": row.advantage,
        "priority": row.priority,
        "use_count": row.use_count,
        "metadata": row.metadata,
        "created_at": row.created_at,
    }


def feedback_record(row) -> dict:
    """One feedback as an export row; `row` is a feedback.Feedback with its experience, other and user loaded."""
    # A preference of value 1 (or of no value: the older rows) says experience beat other: a DPO
    # pair. A tie (0.5) or "both bad" (0) is no pair.
    pair = row.kind == "preference" and row.value in (None, 1.0)
    return {
        "id": row.pk,
        "experience": row.experience_id,
        "other": row.other_id,
        "user": row.user.get_username(),
        "kind": row.kind,
        "value": row.value,
        "label": row.label,
        "edited_text": row.edited_text,
        "comment": row.comment,
        "seconds_spent": row.seconds_spent,
        "prompt": row.experience.prompt_text,
        "response": row.experience.response_text,
        "chosen": row.experience.response_text if pair else None,
        "rejected": row.other.response_text if pair else None,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


class JsonlWriter:
    """One JSON object a line, UTF-8. Non-finite floats (a -inf logprob) are written as JSON's
    common extension -Infinity / NaN, which Python, pandas and rftweb's importer read back."""

    def __init__(self, path: Path):
        self.file = open(path, "w", encoding="utf-8")

    def write(self, records: list[dict]) -> None:
        self.file.writelines(json.dumps(record, ensure_ascii=False, default=_isoformat) + "\n" for record in records)

    def close(self) -> None:
        self.file.close()


class ParquetWriter:
    """One row group a chunk, with the fixed schema (so an empty column keeps its type)."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.schema = schema
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")

    def write(self, records: list[dict]) -> None:
        for record in records:
            for column in JSON_COLUMNS & record.keys():
                record[column] = None if record[column] is None else json.dumps(record[column], ensure_ascii=False)
        self.writer.write_table(pa.Table.from_pylist(records, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


def open_writer(path: Path, fmt: str, schema: pa.Schema):
    if fmt == "jsonl":
        return JsonlWriter(path)
    if fmt == "parquet":
        return ParquetWriter(path, schema)
    raise ValueError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")


def seal(path: Path) -> str:
    """Flush a closed file to the disk (its data, then its directory entry) and return its SHA-256:
    what a retention archive is checked against before any row it holds is deleted."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return sha256(path)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_ids(path: Path) -> np.ndarray:
    """The `id` column of a Parquet experience export, read back from the file."""
    return pq.read_table(path, columns=["id"]).column("id").to_numpy()


def _isoformat(value):
    return value.isoformat()  # datetimes: the only values json cannot write itself
