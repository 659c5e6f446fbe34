"""The job framework: the registry, the one task that runs every job type, progress, failures."""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from apps.buffer.models import BufferJob, Experience
from apps.core import jobs
from apps.core.jobs import JobError
from apps.tasksets.models import Task, Taskset, TasksetImport
from rftweb.celery import app as celery_app
from tests.support import wait_for


@pytest.fixture
def eager_celery():
    """Celery tasks run inline, through the real task (the test settings point at Redis)."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def test_every_job_type_is_registered_once():
    assert {"tasksets.import", *(f"buffer.{kind}" for kind in BufferJob.Kind.values)} <= set(jobs.JOB_TYPES)
    with pytest.raises(ValueError, match="registered twice"):
        jobs.register("tasksets.import")(lambda job, progress: None)


def test_the_one_task_runs_both_kinds_of_job(
    researcher, curator, start_taskset_import, start_promotion, eager_celery, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        imported = start_taskset_import(researcher)
        promoted = start_promotion(3)

    imported.refresh_from_db()
    promoted.refresh_from_db()
    assert (imported.status, imported.rows_done, imported.rows_total, imported.error) == ("succeeded", 30, 30, "")
    assert imported.taskset.task_count == 30 and imported.bytes_done == imported.bytes_total
    assert (promoted.status, promoted.result, promoted.rows_done) == ("succeeded", {"promoted": 3, "skipped": 0}, 3)
    assert Experience.objects.filter(source="expert").count() == 3
    assert imported.started_at <= imported.finished_at and promoted.started_at <= promoted.finished_at


@pytest.mark.django_db(transaction=True)
def test_embedded_the_job_runs_on_a_thread_of_this_process(researcher, start_taskset_import, settings):
    settings.RFTWEB_EMBEDDED = True
    job = start_taskset_import(researcher)  # no transaction: queued at once

    wait_for(lambda: TasksetImport.objects.get(pk=job.pk).is_finished, timeout=30, what="the import")
    job.refresh_from_db()
    assert (job.status, job.taskset.task_count) == ("succeeded", 30)


def test_a_finished_job_is_left_alone(researcher):
    job = TasksetImport.objects.create(original_filename="x.jsonl", name="x", format="jsonl", status="failed")
    assert jobs.run_job("tasksets.tasksetimport", job.pk).status == "failed"
    assert not Taskset.objects.exists()


@pytest.fixture
def unqueued(monkeypatch):
    """Jobs started outside a transaction are not sent to Redis: the test runs them itself."""
    monkeypatch.setattr(jobs, "enqueue", lambda *args, **kwargs: None)


@pytest.fixture
def failing_type(monkeypatch):
    """Makes every TasksetImport run `job_type(job, progress)`, set by the test."""
    monkeypatch.setattr(TasksetImport, "job_type", "test.failing")

    def use(run):
        monkeypatch.setitem(jobs.JOB_TYPES, "test.failing", run)

    return use


def half_done_then(error):
    def run(job, progress):
        taskset = Taskset.objects.create(name="half-done")
        Task.objects.create(taskset=taskset, index=0, prompt="p", answer="a")
        progress(1)
        raise error

    return run


@pytest.mark.django_db(transaction=True)
def test_a_job_error_fails_the_job_with_its_message_and_nothing_half_done(
    researcher, start_taskset_import, failing_type, media_root, unqueued
):
    failing_type(jobs_atomic(half_done_then(JobError("row 7: no answer"))))
    job = start_taskset_import(researcher)

    job = jobs.run_job("tasksets.tasksetimport", job.pk)

    assert (job.status, job.error, job.taskset) == ("failed", "row 7: no answer", None)
    assert job.finished_at is not None and not job.upload
    assert not Taskset.objects.exists() and not any(p.is_file() for p in media_root.rglob("*"))
    assert TasksetImport.objects.get(pk=job.pk).status == "failed"


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_fails_the_job_and_reaches_the_worker(
    researcher, start_taskset_import, failing_type, unqueued
):
    failing_type(jobs_atomic(half_done_then(ZeroDivisionError("division by zero"))))
    job = start_taskset_import(researcher)

    with pytest.raises(ZeroDivisionError):  # logged and re-raised: Celery records it too
        jobs.run_job("tasksets.tasksetimport", job.pk)

    job = TasksetImport.objects.get(pk=job.pk)
    assert (job.status, job.error) == ("failed", "the job failed unexpectedly (ZeroDivisionError('division by zero'))")
    assert not Taskset.objects.exists() and not job.upload


def jobs_atomic(run):
    """The run in one transaction, as the real job types do theirs."""

    def atomic_run(job, progress):
        with transaction.atomic():
            return run(job, progress)

    return atomic_run


# ---- progress ----


def read_elsewhere(job) -> tuple:
    """The job's progress as another process sees it."""
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT rows_done, bytes_done FROM {job._meta.db_table} WHERE id = %s", [job.pk])
            return cursor.fetchone()
    finally:
        other.close()


def listen(job):
    """A channel in the job's live group; returns receive(), the next message on it."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(jobs.job_group(jobs.label(job), job.pk), channel)

    async def receive():
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    return async_to_sync(receive)


@pytest.mark.postgres("progress written on a second connection inside the job's transaction: SQLite has one writer")
@pytest.mark.django_db(transaction=True)
def test_progress_is_written_at_once_and_broadcast_at_most_every_interval(researcher, monkeypatch):
    job = TasksetImport.objects.create(original_filename="x.jsonl", name="x", format="jsonl", bytes_total=1_000)
    receive = listen(job)
    clock = iter([100.0, 100.1, 100.3])  # the time of each call
    monkeypatch.setattr(jobs, "monotonic", lambda: next(clock))

    with jobs.progress_writer(job) as progress:
        progress(10, 100)  # written and sent
        assert read_elsewhere(job) == (10, 100)
        progress(20, 200)  # 0.1 s later: kept for the next write
        assert read_elsewhere(job) == (10, 100)
        progress(30, 300)  # 0.3 s after the first: written and sent
        assert read_elsewhere(job) == (30, 300)

    messages = [receive(), receive()]
    assert [m["type"] for m in messages] == ["job.update", "job.update"]
    assert [(m["payload"]["rows_done"], m["payload"]["percent"]) for m in messages] == [(10, 10), (30, 30)]


def test_inside_a_transaction_progress_is_only_broadcast(researcher):
    """The row could not show it before the job's transaction ends (the tests; SQLite)."""
    job = TasksetImport.objects.create(original_filename="x.jsonl", name="x", format="jsonl", bytes_total=1_000)
    receive = listen(job)
    with jobs.progress_writer(job) as progress:
        progress(5, 500)
    assert TasksetImport.objects.get(pk=job.pk).rows_done == 0
    assert receive()["payload"]["percent"] == 50


@pytest.mark.django_db(transaction=True)
def test_a_job_broadcasts_its_start_and_its_end(curator, start_promotion, unqueued):
    job = start_promotion(2)
    receive = listen(job)

    jobs.run_job("buffer.bufferjob", job.pk)

    states = [receive()["payload"] for _ in range(3)]  # started, its one chunk, finished
    assert [(s["status"], s["finished"]) for s in states] == [
        ("running", False),
        ("running", False),
        ("succeeded", True),
    ]
    assert states[-1] == jobs.snapshot(BufferJob.objects.get(pk=job.pk))
