"""The upload page, the import job it starts, and the job's status endpoint."""

import json
import re
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.urls import reverse

from apps.core import jobs
from apps.tasksets.models import Task, Taskset, TasksetImport
from rftweb.celery import app as celery_app

UPLOAD_URL = reverse("taskset-upload")


def progress_url(job) -> str:
    return reverse("job-progress", args=["tasksets.tasksetimport", job.pk])


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def eager_celery():
    """Run Celery tasks inline, as the embedded mode does (the test settings point at Redis)."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def jsonl_upload(rows, name="questions.jsonl"):
    return SimpleUploadedFile(name, "".join(json.dumps(r) + "\n" for r in rows).encode())


def form_data(upload, **overrides):
    return {
        "file": upload,
        "name": "uploaded",
        "format": "auto",
        "prompt_field": "q",
        "answer_field": "a",
        "metadata_fields": "topic, source",
        "difficulty_field": "",
        "description": "From a test.",
        "default_workflow": "single_turn",
        "default_reward_fn": "numeric",
        **overrides,
    }


ROWS = [{"q": f"What is {i} + 1?", "a": str(i + 1), "topic": "sums", "source": "test"} for i in range(30)]


def test_researcher_uploads_jsonl_and_the_import_job_creates_the_taskset(
    researcher_client, researcher, eager_celery, media_root, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS)))

    job = TasksetImport.objects.get()
    assert response.status_code == 302 and response.url == reverse("taskset-import", args=[job.pk])
    assert (job.status, job.rows_done, job.created_by, job.original_filename) == (
        "succeeded",
        30,
        researcher,
        "questions.jsonl",
    )
    assert job.bytes_done == job.bytes_total > 0
    taskset = Taskset.objects.get(name="uploaded")
    assert job.taskset == taskset and taskset.task_count == Task.objects.filter(taskset=taskset).count() == 30
    assert (taskset.source, taskset.description, taskset.default_reward_fn) == (
        "questions.jsonl",
        "From a test.",
        "numeric",
    )
    assert taskset.tasks.get(index=3).metadata == {"topic": "sums", "source": "test"}
    assert not job.upload and not any(p.is_file() for p in media_root.rglob("*")), "the upload is deleted"

    status = researcher_client.get(progress_url(job)).json()
    assert status == {
        "id": job.pk,
        "status": "succeeded",
        "status_text": "succeeded",
        "cancel_requested": False,
        "cancellable": False,
        "finished": True,
        "rows_done": 30,
        "rows_total": 30,
        "rows_text": "30 of 30",
        "bytes_done": job.bytes_total,
        "bytes_total": job.bytes_total,
        "percent": 100,
        "error": "",
        "result_url": reverse("taskset-detail", args=["uploaded"]),
    }
    page = researcher_client.get(response.url).content.decode()
    assert reverse("taskset-detail", args=["uploaded"]) in page and "job_progress.js" not in page
    # The link reads as the live widget writes it (data-job-result) on a page opened before the end.
    assert 'data-job-result="open taskset uploaded"' in page and ">open taskset uploaded</a>" in page
    detail = researcher_client.get(reverse("taskset-detail", args=["uploaded"])).content.decode()
    assert "<code>q</code>" in detail and "<code>topic</code>, <code>source</code>" in detail
    assert "<th>Difficulty</th>" not in detail  # none mapped: not a column of 0.00 (a walkthrough's finding)


def test_a_bad_upload_fails_the_job_with_the_line_and_leaves_nothing(
    researcher_client, eager_celery, media_root, django_capture_on_commit_callbacks
):
    rows = [*ROWS[:5], {"q": "no answer here"}]
    with django_capture_on_commit_callbacks(execute=True):
        researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(rows, "broken.jsonl"), metadata_fields=""))

    job = TasksetImport.objects.get()
    assert (job.status, job.taskset, job.error) == ("failed", None, "broken.jsonl, line 6: missing field 'a'")
    assert Taskset.objects.count() == Task.objects.count() == 0
    assert not any(p.is_file() for p in media_root.rglob("*"))
    status = researcher_client.get(progress_url(job)).json()
    assert (status["status"], status["finished"], status["error"], status["result_url"]) == (
        "failed",
        True,
        job.error,
        None,
    )
    assert "line 6: missing field" in researcher_client.get(reverse("taskset-import", args=[job.pk])).content.decode()


def test_a_queued_job_shows_a_polling_progress_bar(researcher_client, media_root):
    """Without an eager worker the job waits in the queue; the page follows its progress."""
    response = researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS)))  # on_commit never fires here

    job = TasksetImport.objects.get()
    assert job.status == "pending" and job.upload.name.startswith("uploads/") and job.upload.name.endswith(".jsonl")
    assert (media_root / job.upload.name).is_file()
    page = researcher_client.get(response.url).content.decode()
    assert "job_progress.js" in page and progress_url(job) in page
    status = researcher_client.get(progress_url(job)).json()
    assert (status["status"], status["finished"], status["percent"], status["bytes_total"]) == (
        "pending",
        False,
        0,
        job.bytes_total,
    )


@pytest.mark.parametrize(
    "overrides, field, error",
    [
        ({"name": "taken"}, "name", "a taskset named 'taken' already exists"),
        ({"name": "not a slug"}, "name", "Enter a valid “slug”"),
        (
            {"file": SimpleUploadedFile("tasks.txt", b"x")},
            "format",
            "Cannot tell the format of 'tasks.txt' from its extension; choose one.",
        ),
        (
            {"file": SimpleUploadedFile("big.jsonl", b"x" * 101)},
            "file",
            "The file is 101 bytes; uploads are limited to 100 bytes.",
        ),
        ({"description": "d" * 2001}, "description", "Ensure this value has at most 2000 characters (it has 2001)."),
    ],
)
def test_upload_form_errors(researcher_client, settings, overrides, field, error):
    Taskset.objects.create(name="taken")
    settings.TASKSET_UPLOAD_MAX_BYTES = 100

    response = researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS[:1]), **overrides))

    assert response.status_code == 200
    assert any(error in message.replace("\xa0", " ") for message in response.context["form"].errors[field])
    assert not TasksetImport.objects.exists()


def test_upload_page_needs_the_researcher_role(annotator_client):
    assert annotator_client.get(UPLOAD_URL).status_code == 403
    assert annotator_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS))).status_code == 403
    assert not TasksetImport.objects.exists()


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(UPLOAD_URL)
    assert response.status_code == 302 and response.url.startswith(reverse("login"))


def test_upload_page_and_list_render_for_a_researcher(researcher_client):
    assert b'enctype="multipart/form-data"' in researcher_client.get(UPLOAD_URL).content
    assert UPLOAD_URL.encode() in researcher_client.get(reverse("taskset-list")).content


@pytest.mark.django_db(transaction=True)
def test_progress_is_visible_to_other_connections_while_the_import_runs(researcher, files, monkeypatch):
    """Each batch's progress is seen at once, on SQLite too (it stayed 0 until the end there); the
    taskset only once its last batch is in."""
    path = files.jsonl({"q": f"q{i}", "a": str(i)} for i in range(5_000))
    job = TasksetImport.objects.create(
        original_filename="many.jsonl",
        name="many",
        format="jsonl",
        field_mapping={"prompt": "q", "answer": "a"},
        default_workflow="single_turn",
        default_reward_fn="exact_match",
        bytes_total=path.stat().st_size,
    )
    job.upload.save("many.jsonl", open(path, "rb"))
    seen_by_others = []
    observer = connections.create_connection("default")
    real_writer = jobs.progress_writer

    def observed_writer(job):
        with real_writer(job) as write_progress:

            def write_and_look(rows_done, bytes_done=None):
                write_progress(rows_done, bytes_done)
                with observer.cursor() as cursor:
                    cursor.execute("SELECT status, rows_done FROM tasksets_tasksetimport WHERE id = %s", [job.pk])
                    status, rows_done = cursor.fetchone()
                    cursor.execute("SELECT count(*) FROM tasksets_taskset WHERE name = 'many' AND ready")
                    seen_by_others.append((status, rows_done, cursor.fetchone()[0]))

            yield write_and_look

    monkeypatch.setattr(jobs, "progress_writer", contextmanager(observed_writer))
    monkeypatch.setattr(jobs, "PROGRESS_INTERVAL_SECONDS", 0)  # every batch's progress
    try:
        jobs.run_job("tasksets.tasksetimport", job.pk)
    finally:
        observer.close()

    batches = [("running", rows, 0) for rows in range(settings.IMPORT_BATCH_ROWS, 5_001, settings.IMPORT_BATCH_ROWS)]
    assert seen_by_others == [*batches, ("running", 5_000, 1)]
    job.refresh_from_db()
    assert (job.status, job.rows_done, job.taskset.task_count) == ("succeeded", 5_000, 5_000)


def test_a_finished_job_is_not_run_again(researcher):
    job = TasksetImport.objects.create(
        original_filename="x.jsonl",
        name="x",
        format="jsonl",
        status="succeeded",
        default_workflow="single_turn",
        default_reward_fn="exact_match",
    )
    assert jobs.run_job("tasksets.tasksetimport", job.pk).status == "succeeded"
    assert not Taskset.objects.exists()


# ---- a form error keeps the file ----


def kept_token(page: str) -> str:
    match = re.search(r'name="staged" value="([^"]+)"', page)
    assert match, "the page names the kept file"
    return match.group(1)


def test_after_a_form_error_the_file_is_kept_and_the_next_submit_imports_it(
    researcher_client, eager_celery, media_root, django_capture_on_commit_callbacks
):
    Taskset.objects.create(name="taken")

    first = researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS), name="taken"))

    page = first.content.decode()
    assert first.status_code == 200 and "Keeping <strong><bdi>questions.jsonl</bdi></strong>" in page
    assert not TasksetImport.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        second = researcher_client.post(UPLOAD_URL, form_data("", name="fresh", staged=kept_token(page)))

    job = TasksetImport.objects.get()
    assert second.status_code == 302 and (job.status, job.rows_done, job.original_filename) == (
        "succeeded", 30, "questions.jsonl"
    )
    assert Taskset.objects.get(name="fresh").task_count == 30
    assert not any(p.is_file() for p in media_root.rglob("*")), "the kept file and the upload are deleted"


def test_a_new_file_replaces_the_kept_one(researcher_client, media_root):
    Taskset.objects.create(name="taken")
    token = kept_token(researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS), name="taken")).content.decode())

    again = researcher_client.post(
        UPLOAD_URL, form_data(jsonl_upload(ROWS[:2], name="other.jsonl"), name="taken", staged=token)
    )

    assert "Keeping <strong><bdi>other.jsonl</bdi></strong>" in again.content.decode()
    assert len([p for p in (media_root / "staged").iterdir()]) == 1, "the first kept file is gone"


@pytest.mark.parametrize("whose", ["another researcher's", "tampered"])
def test_a_kept_file_is_used_only_by_its_uploader(researcher_client, client, django_user_model, whose):
    Taskset.objects.create(name="taken")
    token = kept_token(researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS), name="taken")).content.decode())
    if whose == "tampered":
        token = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    else:
        other = django_user_model.objects.create_user("other", password="pw")
        other.groups.add(*researcher_client.get(UPLOAD_URL).wsgi_request.user.groups.all())
        researcher_client.force_login(other)

    response = researcher_client.post(UPLOAD_URL, form_data("", name="fresh", staged=token))

    assert response.status_code == 200 and not TasksetImport.objects.exists()
    assert response.context["form"].errors["file"] == ["The file chosen earlier is no longer kept; choose it again."]


def test_no_file_and_nothing_kept_asks_for_a_file(researcher_client):
    response = researcher_client.post(UPLOAD_URL, form_data(""))
    assert response.context["form"].errors["file"] == ["Choose a file to upload."]


def test_workflow_and_reward_fn_are_choices_from_the_registries(researcher_client):
    page = researcher_client.get(UPLOAD_URL).content.decode()
    assert '<option value="multi_turn">' in page and '<option value="llm_judge">' in page
    response = researcher_client.post(UPLOAD_URL, form_data(jsonl_upload(ROWS), default_reward_fn="vibes"))
    assert "Select a valid choice" in response.context["form"].errors["default_reward_fn"][0]
    assert not TasksetImport.objects.exists()


def test_a_generated_tasksets_page_shows_its_difficulty(researcher_client):
    taskset = Taskset.objects.create(name="generated", source="arithmetic:n=1")  # no field mapping
    taskset.tasks.create(index=0, prompt="1 + 2", answer="3", difficulty=1.477)
    detail = researcher_client.get(reverse("taskset-detail", args=["generated"])).content.decode()
    assert "<th>Difficulty</th>" in detail and "<td>1.48</td>" in detail


def test_the_uploader_cancels_a_queued_import_from_its_page(researcher_client, researcher, media_root):
    """Only staff could, in the admin: a researcher who picked the wrong file waited for it."""
    job = TasksetImport.objects.create(original_filename="big.jsonl", name="big", format="jsonl",
                                       default_workflow="single_turn", default_reward_fn="exact_match",
                                       created_by=researcher)
    page = researcher_client.get(reverse("taskset-import", args=[job.pk])).content.decode()
    assert "Cancel this import" in page and reverse("taskset-import-cancel", args=[job.pk]) in page
    response = researcher_client.post(reverse("taskset-import-cancel", args=[job.pk]), follow=True)
    job.refresh_from_db()
    assert job.status == TasksetImport.Status.CANCELLED and not Taskset.objects.filter(name="big").exists()
    page = response.content.decode()
    assert "Import of <bdi>big.jsonl</bdi> cancelled" in page and "Cancel this import" not in page
    again = researcher_client.post(reverse("taskset-import-cancel", args=[job.pk]), follow=True).content.decode()
    assert "has already finished (cancelled): there is nothing to cancel" in again


def test_a_poll_while_a_failing_import_deletes_its_hidden_taskset_answers_json(researcher):
    """The poll read the job naming its hidden taskset, which the failing import deleted before the
    answer was made: Taskset.DoesNotExist, a 500 page to 1 poll in 7 of a failing import."""
    from apps.runs.api.tasksets import import_json

    hidden = Taskset.all_objects.create(name="sums", ready=False)
    TasksetImport.objects.create(original_filename="s.jsonl", name="sums", format="jsonl", taskset=hidden,
                                 field_mapping={"prompt": "q"}, default_workflow="single_turn",
                                 default_reward_fn="exact_match", created_by=researcher)
    polled = TasksetImport.objects.get(name="sums")
    Taskset.all_objects.filter(pk=hidden.pk).delete()  # the failing import, meanwhile
    assert import_json(polled)["taskset"] is None
    ready = Taskset.objects.create(name="sums", ready=True)
    TasksetImport.objects.filter(pk=polled.pk).update(taskset=ready)
    assert import_json(TasksetImport.objects.get(pk=polled.pk))["taskset"] == "sums"
