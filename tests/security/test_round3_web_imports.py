"""Issue #30, low finding 13: JSON nested too deep in an imported file (a taskset's chat prompt, an
expert data row, a JSON text cell of a Parquet file) fails the import with an error naming the
line or row, never "failed unexpectedly (RecursionError)"."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.buffer.expert_import import import_expert_data
from apps.buffer.models import Experience
from apps.core.files import FileImportError
from apps.core.jobs import run_job
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task
from apps.tasksets.services import start_taskset_import

pytestmark = pytest.mark.django_db

GOOD_ROW = {"q": "What is 1 + 1?", "a": "2"}
TOO_DEEP = "JSON nested deeper than 64 levels"  # files.MAX_JSON_DEPTH


def nested(depth: int):
    """A JSON value `depth` objects deep."""
    value = "deep"
    for _ in range(depth):
        value = {"a": value}
    return value


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def import_job(content: bytes, researcher):
    job = start_taskset_import(
        upload=SimpleUploadedFile("deep.jsonl", content), name="deep", fmt="jsonl", mapping=FieldMapping("q", "a"),
        user=researcher,
    )
    return run_job("tasksets.tasksetimport", job.pk)


def test_a_chat_prompt_nested_500_deep_fails_the_import_naming_its_line(researcher, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    chat = [{"role": "user", "content": "hi", "extra": nested(500)}]
    job = import_job(jsonl(GOOD_ROW, {"q": chat, "a": "4"}), researcher)
    assert (job.status, job.error) == ("failed", f"deep.jsonl, line 2: {TOO_DEEP}")
    assert not Task.objects.exists()


def test_json_too_deep_for_the_json_parser_itself_is_named_the_same_way(researcher, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    job = import_job(jsonl(GOOD_ROW) + b"[" * 100_000 + b"]" * 100_000 + b"\n", researcher)
    assert (job.status, job.error) == ("failed", f"deep.jsonl, line 2: {TOO_DEEP}")


def test_a_chat_prompt_as_deep_as_allowed_imports(researcher, settings, tmp_path):
    """The control: 64 levels in all (the row, the chat, a message, 61 more) import."""
    settings.MEDIA_ROOT = tmp_path
    chat = [{"role": "user", "content": "hi", "extra": nested(61)}]
    assert import_job(jsonl({"q": chat, "a": "4"}), researcher).status == "succeeded"


def test_expert_data_nested_too_deep_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "expert.jsonl"
    path.write_bytes(jsonl({"prompt": "p", "response": "r"}, {"prompt": "p", "response": "r", "metadata": nested(500)}))
    with pytest.raises(FileImportError, match=f"expert.jsonl, line 2: {TOO_DEEP}"):
        import_expert_data(path, layout="sft")
    assert not Experience.objects.exists()


def test_a_parquet_json_text_cell_nested_too_deep_is_refused_naming_the_row(tmp_path):
    path = tmp_path / "expert.parquet"
    pq.write_table(
        pa.table({"prompt": ["p", "p"], "response": ["r", "r"], "metadata": ["{}", json.dumps(nested(500))]}), path
    )
    with pytest.raises(FileImportError, match=f"row 2: 'metadata': {TOO_DEEP}"):
        import_expert_data(path, layout="sft")
    assert not Experience.objects.exists()
