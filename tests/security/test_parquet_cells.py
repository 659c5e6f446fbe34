"""Issue #20 finding 3: a Parquet cell is held to the same size limit as a JSONL or CSV line.

A few KB of zstd Parquet can hold prompts of hundreds of MB. Every mapped cell over the limit
(1 MiB for tasks, 64 MiB for expert data) refuses the import whole, naming the row and the
column; a file whose own metadata gives it away is refused before anything is decompressed."""
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.buffer.expert_import import import_expert_data
from apps.buffer.importers import MAX_LINE_BYTES as EXPERT_LIMIT
from apps.buffer.models import Experience
from apps.core.files import FileImportError
from apps.tasksets.importers import DEFAULT_MAX_LINE_BYTES as LIMIT
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task, Taskset
from apps.tasksets.services import import_taskset

pytestmark = pytest.mark.django_db
MAPPING = FieldMapping("q", "a", metadata=("m",))


def write_parquet(path, table: dict, **options) -> None:
    pq.write_table(pa.table(table), path, compression="zstd", **options)


def refusal(path, mapping=MAPPING) -> str:
    with pytest.raises(FileImportError) as err:
        import_taskset(path, name="bad", mapping=mapping)
    assert not Taskset.objects.exists() and not Task.objects.exists()
    return str(err.value)


def test_the_issue_file_three_huge_prompts_in_a_few_kilobytes_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.parquet"
    huge = "x" * (100 * 1024 * 1024)
    write_parquet(path, {"q": [huge] * 3, "a": ["1", "2", "3"], "m": ["", "", ""]})
    del huge
    assert path.stat().st_size < 64 * 1024
    started = time.monotonic()
    message = refusal(path)
    assert time.monotonic() - started < 10  # 0.5 ms here: the metadata gave it away (reading it all took 22 s)
    assert "bomb.parquet" in message and "'q'" in message and "row" in message and f"{LIMIT:,}" in message, message


@pytest.mark.parametrize("column", ["q", "a", "m"])
def test_one_cell_over_the_limit_among_small_ones_is_refused_naming_its_row_and_column(tmp_path, column):
    """The row group's total stays under rows x limit, so only the per-cell check can catch it."""
    rows = 50
    table = {"q": [f"{i}+1?" for i in range(rows)], "a": [str(i + 1) for i in range(rows)], "m": ["note"] * rows}
    table[column][36] = "y" * (LIMIT + 1)
    path = tmp_path / "t.parquet"
    write_parquet(path, table)
    message = refusal(path)
    assert f"t.parquet, row 37: column {column!r} is {LIMIT + 1:,} bytes" in message, message


@pytest.mark.slow
def test_a_value_over_the_limit_repeated_in_many_cells_is_refused_at_its_first_row(tmp_path):
    """Stored once in the dictionary page, so the row group looks small (the first check passes);
    read as a dictionary, it is measured once per cell without being copied into each."""
    rows = 1500
    path = tmp_path / "t.parquet"
    write_parquet(
        path, {"q": ["1+1?"] * 3 + ["w" * (LIMIT + 1)] * rows, "a": ["2"] * (rows + 3), "m": [""] * (rows + 3)}
    )
    assert path.stat().st_size < 64 * 1024
    message = refusal(path)
    assert f"t.parquet, row 4: column 'q' is {LIMIT + 1:,} bytes" in message, message


def test_a_chat_prompt_cell_over_the_limit_is_refused(tmp_path):
    messages = [[{"role": "user", "content": "hi"}]] * 9 + [[{"role": "user", "content": "z" * LIMIT}]]
    path = tmp_path / "chat.parquet"
    write_parquet(path, {"q": messages, "a": ["ok"] * 10})
    message = refusal(path, FieldMapping("q", "a"))
    assert "row 10: column 'q'" in message, message


def test_cells_at_the_limit_import(tmp_path):
    path = tmp_path / "t.parquet"
    write_parquet(path, {"q": ["q" * (LIMIT - 100), "2+2?"], "a": ["a", "4"], "m": ["", ""]})
    assert import_taskset(path, name="ok", mapping=FieldMapping("q", "a", metadata=("m",))).task_count == 2


def test_an_expert_data_cell_over_its_limit_is_refused(tmp_path, researcher):
    path = tmp_path / "e.parquet"
    write_parquet(path, {"prompt": ["p", "p"], "response": ["r", "r" * (EXPERT_LIMIT + 1)]}, row_group_size=1)
    with pytest.raises(FileImportError) as err:
        import_expert_data(path, layout="sft", user=researcher)
    assert "e.parquet, row 2: column 'response'" in str(err.value), str(err.value)
    assert not Experience.objects.exists()
