"""Bad taskset files (JSONL, CSV, Parquet) and bad expert data files: each import is refused whole
with an error naming the file, the line or row, and the problem; nothing is created."""
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.buffer.expert_import import import_expert_data
from apps.buffer.models import Experience
from apps.core.files import FileImportError
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task, Taskset
from apps.tasksets.services import import_taskset

pytestmark = pytest.mark.django_db

MAPPING = FieldMapping("q", "a")


def parquet_bytes(table: dict) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(table), sink)
    return sink.getvalue()


GOOD_JSONL = b'{"q": "1+1?", "a": "2"}\n'
TASKSET_CASES = {
    # JSONL
    "jsonl-empty": ("t.jsonl", b"", "has no rows"),
    "jsonl-not-json": ("t.jsonl", GOOD_JSONL + b"{q: 1}\n", "line 2"),
    "jsonl-array-row": ("t.jsonl", GOOD_JSONL + b"[1, 2]\n", "expected a JSON object"),
    "jsonl-missing-answer": ("t.jsonl", GOOD_JSONL + b'{"q": "2+2?"}\n', "missing field 'a'"),
    "jsonl-null-answer": ("t.jsonl", GOOD_JSONL + b'{"q": "2+2?", "a": null}\n', "is null"),
    "jsonl-empty-prompt": ("t.jsonl", GOOD_JSONL + b'{"q": "", "a": "4"}\n', "is empty"),
    "jsonl-bad-chat": ("t.jsonl", GOOD_JSONL + b'{"q": [{"role": "user"}], "a": "4"}\n', "content"),
    "jsonl-nul": ("t.jsonl", GOOD_JSONL + b'{"q": "a\\u0000b", "a": "4"}\n', "NUL"),
    "jsonl-not-utf8": ("t.jsonl", GOOD_JSONL + b'{"q": "\xff\xfe", "a": "4"}\n', "line 2"),
    "jsonl-binary-garbage": ("t.jsonl", bytes(range(256)) * 4, "line 1"),
    "jsonl-python-code": ("t.jsonl", b"import os; os.system('touch /tmp/rftweb-pwned')\n", "line 1"),
    # CSV
    "csv-header-only": ("t.csv", b"q,a\n", "has no rows"),
    "csv-missing-column": ("t.csv", b"q,b\n1+1?,2\n", "'a'"),
    "csv-short-row": ("t.csv", b"q,a\n1+1?,2\n2+2?\n", "line 3"),
    "csv-unclosed-quote": ("t.csv", b'q,a\n"1+1?,2\n', "line 2"),
    # Parquet
    "parquet-corrupt": ("t.parquet", b"PAR1 not really", "not a readable Parquet file"),
    "parquet-missing-column": ("t.parquet", parquet_bytes({"q": ["1+1?"], "b": ["2"]}), "no column 'a'"),
    "parquet-null-answer": ("t.parquet", parquet_bytes({"q": ["1+1?", "2+2?"], "a": ["2", None]}), "row 2"),
    # the file name
    "unknown-extension": ("t.exe", GOOD_JSONL, "t.exe"),
}


@pytest.mark.parametrize("filename, content, words", TASKSET_CASES.values(), ids=TASKSET_CASES.keys())
def test_bad_taskset_file_is_refused_whole(tmp_path, filename, content, words):
    path = tmp_path / filename
    path.write_bytes(content)
    with pytest.raises(FileImportError) as err:
        import_taskset(path, name="bad", mapping=MAPPING)
    message = str(err.value)
    assert filename in message and words in message, message
    assert not Taskset.objects.exists() and not Task.objects.exists()


def test_the_good_taskset_file_imports(tmp_path):
    """The control: the cases above break one thing in a file that imports."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD_JSONL)
    assert import_taskset(path, name="good", mapping=MAPPING).task_count == 1


GOOD_SFT = {"prompt": "1+1?", "response": "2"}
EXPERT_CASES = {
    "sft-missing-response": ("e.jsonl", "sft", [GOOD_SFT, {"prompt": "2+2?"}], "line 2"),
    "sft-reward-not-a-number": ("e.jsonl", "sft", [GOOD_SFT, {**GOOD_SFT, "reward": "high"}], "reward"),
    "sft-reward-infinite": ("e.jsonl", "sft", [GOOD_SFT, {**GOOD_SFT, "reward": 1e400}], "reward"),
    "sft-token-ids-not-ints": (
        "e.jsonl", "sft", [GOOD_SFT, {**GOOD_SFT, "prompt_ids": ["a"], "response_ids": [1]}], "prompt_ids"
    ),
    "sft-token-id-overflow": (
        "e.jsonl", "sft", [GOOD_SFT, {**GOOD_SFT, "prompt_ids": [2**40], "response_ids": [1]}], "prompt_ids"
    ),
    "sft-bad-messages": ("e.jsonl", "sft", [GOOD_SFT, {"messages": [{"role": 5}]}], "messages"),
    "dpo-missing-rejected": ("e.jsonl", "dpo", [{"prompt": "p", "chosen": "a"}], "rejected"),
    "sft-csv-format": ("e.csv", "sft", [GOOD_SFT], "e.csv"),
}


@pytest.mark.parametrize("filename, layout, rows, words", EXPERT_CASES.values(), ids=EXPERT_CASES.keys())
def test_bad_expert_data_is_refused_whole(tmp_path, researcher, filename, layout, rows, words):
    path = tmp_path / filename
    path.write_text("".join(json.dumps(row).replace("Infinity", "1e400") + "\n" for row in rows))
    with pytest.raises(FileImportError) as err:
        import_expert_data(path, layout=layout, user=researcher)
    message = str(err.value)
    assert filename in message and words in message, message
    assert not Experience.objects.exists()


def test_good_expert_data_imports(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(GOOD_SFT) + "\n")
    assert import_expert_data(path, layout="sft").rows == 1
