"""CSRF on every form, session and token auth on the API, and uploads: size-limited, stored under a
random name, never served and never executed."""
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.core import jobs
from apps.runs.api import token_for
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset, TasksetImport

Status = Run.Status


@pytest.fixture
def running(curator):
    return Run.objects.create(name="r", owner=curator, config={}, status=Status.RUNNING)


@pytest.fixture
def strict(curator):
    """A browser session that does not send the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(curator)
    return client


@pytest.fixture
def experience(running):
    task = Task.objects.create(taskset=Taskset.objects.create(name="ts"), index=0, prompt="1+1?", answer="2")
    return Experience.objects.create(run=running, task=task, explorer_step=0, rollout_index=0, group_id="g",
                                     prompt_text="1+1?", response_text="2", prompt_ids=[1], response_ids=[2],
                                     action_mask=[1], logprobs=[0.0], reward=1.0, model_version=0)


FORMS = {
    "login": lambda o: (reverse("login"), {"username": "cur", "password": "pw-for-tests-123"}),
    "logout": lambda o: (reverse("logout"), {}),
    "run-launch": lambda o: (reverse("run-launch"), {"name": "x", "editor": "yaml", "yaml": "{}"}),
    "run-pause": lambda o: (reverse("run-pause", args=[o["run"].pk]), {}),
    "run-stop": lambda o: (reverse("run-stop", args=[o["run"].pk]), {}),
    "run-bulk-stop": lambda o: (reverse("run-bulk-stop"), {"runs": [o["run"].pk]}),
    "taskset-upload": lambda o: (reverse("taskset-upload"), {"name": "x"}),
    "annotate-rate": lambda o: (reverse("annotate-rate", args=[o["experience"].pk]), {"point": "3"}),
    "annotate-flag": lambda o: (reverse("annotate-flag", args=[o["experience"].pk]), {"reason": "garbled"}),
    "annotate-assign": lambda o: (reverse("annotate-assign", args=[o["run"].pk]), {"usernames": "cur"}),
    "admin-action": lambda o: (
        reverse("admin:buffer_experience_changelist"),
        {"action": "delete_selected", "_selected_action": [o["experience"].pk]},
    ),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_a_form_post_without_the_csrf_token_is_refused_and_changes_nothing(strict, running, experience, form):
    url, data = form({"run": running, "experience": experience})
    response = strict.post(url, data)
    assert response.status_code == 403, url
    assert Run.objects.get(pk=running.pk).status == Status.RUNNING
    assert Experience.objects.filter(pk=experience.pk).exists() and not experience.feedback.exists()


def test_the_same_form_with_the_token_goes_through(strict, running):
    strict.get(reverse("run-detail", args=[running.pk]))  # sets the csrftoken cookie, as a page does
    token = strict.cookies["csrftoken"].value
    response = strict.post(reverse("run-pause", args=[running.pk]), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302 and Run.objects.get(pk=running.pk).status == Status.PAUSED


def test_the_api_with_a_session_needs_the_csrf_header_and_with_a_token_does_not(strict, running, curator):
    url = reverse("api-run-pause", args=[running.pk])
    refused = strict.post(url)
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    assert Run.objects.get(pk=running.pk).status == Status.RUNNING
    strict.get(reverse("run-detail", args=[running.pk]))
    allowed = strict.post(url, HTTP_X_CSRFTOKEN=strict.cookies["csrftoken"].value)
    assert allowed.status_code == 200 and allowed.json()["status"] == "paused"
    scripted = Client(enforce_csrf_checks=True).post(
        reverse("api-run-resume", args=[running.pk]), HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}"
    )
    assert scripted.status_code == 200 and scripted.json()["status"] == "running"


def test_a_token_dies_with_the_password(running, curator):
    token = token_for(curator)
    curator.set_password("a-new-password-456")
    curator.save()
    response = Client().get(reverse("api-runs"), HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 401


# ---- uploads ---------------------------------------------------------------------------------------


@pytest.fixture
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def upload_form(upload, **extra):
    return {"file": upload, "name": "up", "format": "jsonl", "prompt_field": "q", "answer_field": "a",
            "default_workflow": "single_turn", "default_reward_fn": "exact_match", **extra}


def test_an_upload_over_the_limit_is_refused_and_nothing_is_kept(researcher_client, settings, media_root):
    settings.TASKSET_UPLOAD_MAX_BYTES = 1000
    big = SimpleUploadedFile("big.jsonl", (json.dumps({"q": "x" * 100, "a": "y"}) + "\n").encode() * 20)
    response = researcher_client.post(reverse("taskset-upload"), upload_form(big))
    assert response.status_code == 200
    assert "uploads are limited to 1000" in response.content.decode()
    assert not TasksetImport.objects.exists() and not any(p.is_file() for p in Path(media_root).rglob("*"))


@pytest.mark.parametrize("name", ["../../../etc/cron.d/evil.jsonl", "evil.py", "run.sh", "<script>.jsonl"])
def test_an_upload_is_stored_under_a_random_name_never_served_and_read_only_as_data(
    researcher_client, media_root, name, tmp_path
):
    marker = tmp_path / "executed"
    code = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n"
    response = researcher_client.post(reverse("taskset-upload"), upload_form(SimpleUploadedFile(name, code.encode())))
    assert response.status_code == 302
    job = TasksetImport.objects.get()
    stored = Path(job.upload.path).resolve()
    assert stored.is_relative_to(Path(media_root).resolve() / "uploads")
    assert Path(name).stem not in stored.name and len(stored.stem) == 32  # a uuid, not the user's name
    assert job.original_filename == Path(name).name
    # No URL serves uploads.
    for url in (f"/media/{job.upload.name}", f"/{job.upload.name}", f"/static/{job.upload.name}"):
        assert researcher_client.get(url).status_code == 404, url
    # The import reads it as data: it fails on line 1, and nothing ran.
    job = jobs.run_job("tasksets.tasksetimport", job.pk)
    assert job.status == "failed" and "line 1" in job.error
    assert not marker.exists()
