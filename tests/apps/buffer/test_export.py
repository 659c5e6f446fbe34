"""Exports of experiences and feedback (JSONL, Parquet), their round trip through the importer,
the admin's export action and download, and flat memory while exporting."""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.urls import reverse

from apps.buffer import expert_import, services
from apps.buffer.models import BufferJob, Experience
from apps.core.jobs import run_job
from apps.feedback.models import Feedback

CHANGELIST = "/admin/buffer/experience/"
# What an import keeps of an exported experience (source, status, run, task and ids are the
# importing buffer's own: an import is expert data).
KEPT = (
    "prompt_text",
    "response_text",
    "messages",
    "prompt_ids",
    "response_ids",
    "action_mask",
    "logprobs",
    "reward",
    "reward_components",
    "group_id",
    "rollout_index",
    "model_version",
    "priority",
    "metadata",
)


@pytest.fixture
def varied(make_experience):
    """Experiences with everything an export has to carry exactly."""
    return [
        make_experience(
            prompt_ids=[0, 2**31 - 1, -(2**31)],
            response_ids=[5, 150_000],
            action_mask=[1, 0],
            logprobs=[-1.2345678, -math.inf],
            reward=0.1 + 0.2,
            reward_components={"exact_match": 1.0, "format": -0.25},
            metadata={"finish_reason": "stop", "nested": {"list": [1, "two", None]}},
            priority=1.5,
            model_version=3,
        ),
        make_experience(
            prompt_text="Hello\nworld — ünïcode \U0001f600",
            response_text="Hello",  # not empty: an import refuses a row that teaches nothing
            response_ids=[],
            action_mask=[],
            logprobs=None,
            reward=None,
            reward_components={},
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "tool_calls": []},
            ],
        ),
        make_experience(
            run=None,
            task=None,
            prompt_ids=None,
            response_ids=None,
            action_mask=None,
            logprobs=None,
            source="expert",
            status="rejected",
            reward=-2.0,
        ),
    ]


def export(queryset, fmt, tmp_path) -> Path:
    job = run_job("buffer.bufferjob", services.start_export(queryset, fmt=fmt).pk)
    assert job.status == "succeeded", job.error
    return Path(job.output.path)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_gives_identical_experiences(varied, fmt, tmp_path, curator):
    path = export(Experience.objects.order_by("pk"), fmt, tmp_path)

    created = expert_import.import_expert_data(path, layout="sft", user=curator)

    assert created.rows == len(varied)
    imported = list(Experience.objects.exclude(pk__in=[e.pk for e in varied]).order_by("pk"))
    for original, copy in zip(varied, imported, strict=True):
        original.refresh_from_db()
        for name in KEPT:
            assert getattr(copy, name) == getattr(original, name), name
        assert (copy.source, copy.status, copy.run_id, copy.task_id) == ("expert", "ready", None, None)


def test_jsonl_export_is_one_object_a_line_with_every_field(varied, tmp_path):
    path = export(Experience.objects.filter(pk=varied[0].pk), "jsonl", tmp_path)
    [line] = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(line)
    assert record["prompt"] == varied[0].prompt_text and record["response"] == varied[0].response_text
    assert record["response_ids"] == [5, 150_000] and record["logprobs"][1] == -math.inf
    assert record["run"] == varied[0].run_id and record["task"] == varied[0].task_id and record["source"] == "rollout"
    assert "-Infinity" in line


def test_parquet_export_has_typed_columns(varied, tmp_path):
    path = export(Experience.objects.order_by("pk"), "parquet", tmp_path)
    table = pq.read_table(path)
    assert table.schema.field("response_ids").type.value_type == pa.int32()
    assert table.schema.field("logprobs").type.value_type == pa.float32()
    assert table.column("reward").to_pylist()[2] == -2.0
    assert json.loads(table.column("metadata").to_pylist()[0])["nested"] == {"list": [1, "two", None]}


def test_export_is_one_action_whose_job_page_downloads_the_file(curator_client, varied):
    """The format is chosen beside the action; the action starts the job at once (no confirmation
    page) and its job page downloads the file when written."""
    selected = [varied[0].pk, varied[2].pk]
    data = {"action": "export_selection", "_selected_action": selected, "select_across": 0, "index": 0}
    assert 'name="export_format"' in curator_client.get(CHANGELIST).content.decode()

    response = curator_client.post(CHANGELIST, data | {"export_format": "jsonl"})

    job_url, _, query = response["Location"].partition("?")
    assert response.status_code == 302 and query == "download=1"
    job_id = int(job_url.rstrip("/").split("/")[-2])
    download_url = reverse("admin:buffer_bufferjob_download", args=[job_id])
    queued = curator_client.get(response["Location"]).content.decode()
    assert f'data-download-when-finished="{download_url}"' in queued and "job_progress.js" in queued
    job = run_job("buffer.bufferjob", job_id)
    assert job.result["exported"] == 2 and job.rows_total == 2

    finished = curator_client.get(response["Location"]).content.decode()
    assert f'data-job-download="{download_url}"' in finished and services.export_filename(job) in finished
    assert "data-job-download" not in curator_client.get(job_url).content.decode(), "only when asked"
    download = curator_client.get(download_url)
    assert download["Content-Disposition"] == f'attachment; filename="experiences-{job_id}.jsonl"'
    assert download["Content-Type"] == "application/jsonl"  # it was application/octet-stream
    assert [json.loads(line)["id"] for line in b"".join(download).splitlines()] == selected

    curator_client.post(reverse("admin:buffer_bufferjob_delete", args=[job_id]), {"post": "yes"})
    assert not Path(job.output.path).exists() and not BufferJob.objects.exists()


def test_an_unknown_export_format_starts_nothing(curator_client, varied):
    data = {"action": "export_selection", "_selected_action": [varied[0].pk], "select_across": 0, "index": 0}
    response = curator_client.post(CHANGELIST, data | {"export_format": "xlsx"}, follow=True)
    assert "Export: Select a valid choice. xlsx is not one of the available choices." in response.content.decode()
    assert not BufferJob.objects.exists()


def test_a_failed_export_leaves_no_file(varied, monkeypatch, media_root):
    def broken(row):
        raise RuntimeError("disk full")

    monkeypatch.setitem(services.EXPORTS, "experiences", (*services.EXPORTS["experiences"][:2], broken))
    job = services.start_export(Experience.objects.all(), fmt="jsonl")
    with pytest.raises(RuntimeError):
        run_job("buffer.bufferjob", job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and "disk full" in job.error and not job.output
    assert not list(media_root.glob("buffer-jobs/*"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_feedback_export_and_dpo_pairs_import_back(make_experience, annotator, curator, fmt, tmp_path):
    chosen, rejected, rated = (
        make_experience(response_text="good"),
        make_experience(response_text="bad"),
        make_experience(),
    )
    Feedback.objects.create(experience=chosen, user=annotator, kind="preference", other=rejected, value=1.0, label="a")
    Feedback.objects.create(experience=rated, user=annotator, kind="rating", value=0.75, label="4", comment="fine")
    Feedback.objects.create(experience=rated, user=annotator, kind="preference", other=chosen, value=0.5, label="tie")

    path = export(Feedback.objects.order_by("pk"), fmt, tmp_path)

    rows = pq.read_table(path).to_pylist() if fmt == "parquet" else [json.loads(line) for line in path.open()]
    pair, rating, tie = rows
    assert (pair["kind"], pair["chosen"], pair["rejected"], pair["user"], pair["label"]) == (
        "preference",
        "good",
        "bad",
        "ann",
        "a",
    )
    assert (rating["value"], rating["label"], rating["comment"], rating["response"], rating["chosen"]) == (
        0.75,
        "4",
        "fine",
        rated.response_text,
        None,
    )
    assert (tie["value"], tie["chosen"], tie["rejected"]) == (0.5, None, None)  # a tie is no DPO pair

    pairs_only = export(Feedback.objects.filter(kind="preference", value=1.0), fmt, tmp_path)
    # one pair (two experiences)
    assert expert_import.import_expert_data(pairs_only, layout="dpo", user=curator).rows == 1
    imported = Feedback.objects.get(user=curator)
    assert (imported.experience.response_text, imported.other.response_text, imported.value) == ("good", "bad", 1.0)


def test_export_reads_the_selection_in_chunks(make_experience, monkeypatch, tmp_path):
    rows = [make_experience() for _ in range(7)]
    monkeypatch.setattr(services, "CHUNK_ROWS", 3)
    path = export(Experience.objects.all(), "parquet", tmp_path)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3  # one a chunk
    assert pq.read_table(path).column("id").to_pylist() == [row.pk for row in rows]
