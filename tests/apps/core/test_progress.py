"""The one progress endpoint and the job websocket: who sees which job, and what they see."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import BufferJob
from apps.core import jobs
from apps.tasksets.models import Taskset, TasksetImport
from rftweb.asgi import application


def progress_url(job) -> str:
    return reverse("job-progress", args=[jobs.label(job), job.pk])


@pytest.fixture
def other_researcher(db):
    return create_user("other", "pw-for-tests-123", roles=[RESEARCHER])


@pytest.fixture
def taskset_import(researcher, run_here):
    return run_here(TasksetImport.objects.create(
        original_filename="x.jsonl", name="x", format="jsonl", bytes_total=1_000, bytes_done=250, rows_done=40,
        created_by=researcher,
    ))


@pytest.fixture
def buffer_job(curator):
    return BufferJob.objects.create(kind=BufferJob.Kind.PROMOTE, rows_total=10, rows_done=3, created_by=curator)


def test_the_snapshot_is_what_the_widget_shows(client, researcher, taskset_import):
    client.force_login(researcher)
    assert client.get(progress_url(taskset_import)).json() == {
        "id": taskset_import.pk,
        "status": "running",
        "status_text": "running",
        "cancel_requested": False,
        "cancellable": True,  # an import rolls back at its next batch
        "finished": False,
        "rows_done": 40,
        "rows_total": 0,
        "rows_text": "40",
        "bytes_done": 250,
        "bytes_total": 1_000,
        "percent": 25,  # an import goes by the bytes of its file
        "error": "",
        "result_url": None,
    }


def test_a_pending_job_says_when_no_worker_takes_jobs(settings, curator, buffer_job):
    """Full stack, with the jobs worker gone: it said "pending" alone, for as long as nobody came."""
    from apps.runs import capacity

    settings.RFTWEB_EMBEDDED = False
    waiting = "pending: no live worker takes jobs (the default queue) now; it starts once one does"
    assert jobs.snapshot(buffer_job)["status_text"].startswith(waiting)
    capacity.register("jobs@vm", ["default"], 1)
    assert jobs.snapshot(buffer_job)["status_text"] == "pending"


def test_a_finished_job_links_its_result(client, researcher, taskset_import):
    taskset = taskset_import.taskset = Taskset.objects.create(name="made")
    taskset_import.status, taskset_import.finished_at = "succeeded", timezone.now()
    taskset_import.save()
    client.force_login(researcher)
    snapshot = client.get(progress_url(taskset_import)).json()
    assert (snapshot["percent"], snapshot["finished"], snapshot["result_url"]) == (
        100,
        True,
        reverse("taskset-detail", args=[taskset.name]),
    )


@pytest.mark.parametrize(
    ("who", "expected"),
    [("researcher", 200), ("other_researcher", 404), ("curator", 200), ("annotator", 404)],
)
def test_an_import_is_seen_by_its_uploader_and_curators(client, request, taskset_import, who, expected):
    client.force_login(request.getfixturevalue(who))
    assert client.get(progress_url(taskset_import)).status_code == expected


@pytest.mark.parametrize(("who", "expected"), [("curator", 200), ("researcher", 404), ("annotator", 404)])
def test_a_buffer_job_is_seen_by_who_sees_it_in_the_admin(client, request, buffer_job, who, expected):
    client.force_login(request.getfixturevalue(who))
    response = client.get(progress_url(buffer_job))
    assert response.status_code == expected
    if expected == 200:
        assert (response.json()["rows_done"], response.json()["percent"]) == (3, 30)


def test_anonymous_users_are_sent_to_log_in(client, taskset_import):
    response = client.get(progress_url(taskset_import))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))


@pytest.mark.parametrize("label", ["tasksets.taskset", "auth.user", "nosuch.model", "buffer"])
def test_only_jobs_have_progress(client, curator, label):
    client.force_login(curator)
    assert client.get(reverse("job-progress", args=[label, 1])).status_code == 404


def test_the_pages_follow_their_job_with_the_widget(client, researcher, curator, taskset_import, buffer_job):
    client.force_login(researcher)
    page = client.get(reverse("taskset-import", args=[taskset_import.pk])).content.decode()
    assert "js/job_progress.js" in page and progress_url(taskset_import) in page
    assert f'data-socket-path="/ws/jobs/tasksets.tasksetimport/{taskset_import.pk}/"' in page
    client.force_login(curator)
    page = client.get(reverse("admin:buffer_bufferjob_change", args=[buffer_job.pk])).content.decode()
    assert "js/job_progress.js" in page and progress_url(buffer_job) in page and "data-reload-when-finished" in page


# ---- the websocket ----


def connect(client, user, job) -> WebsocketCommunicator:
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    return WebsocketCommunicator(application, f"/ws/jobs/{jobs.label(job)}/{job.pk}/", headers=headers)


@pytest.mark.django_db(transaction=True)
def test_the_uploader_follows_the_job_live(client, researcher, taskset_import):
    ws = connect(client, researcher, taskset_import)

    async def scenario():
        assert (await ws.connect())[0]
        await database_sync_to_async(jobs.broadcast)(taskset_import)
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    assert async_to_sync(scenario)() == {"type": "job", "job": jobs.snapshot(taskset_import)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who", ["other_researcher", "annotator"])
def test_others_cannot_follow_the_job(client, request, taskset_import, who):
    ws = connect(client, request.getfixturevalue(who), taskset_import)

    async def scenario():
        return await ws.connect()

    assert async_to_sync(scenario)() == (False, 4403)
