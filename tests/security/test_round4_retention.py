"""Issue #41, finding 1 (High): deleting a running buffer job lost the data it was moving.

A curator archived an ended run and deleted its retention job in the admin during the delete pass:
the archive went at once, the worker went on deleting, and the end state was no rows, no archive,
no job, and a run marked retired (`DatabaseError: Save with update_fields did not affect any rows`).
Deleted during the archive pass, the job deleted no rows but left the run retired for a job that no
longer existed.

Now a pending or running job cannot be deleted (single or bulk); Cancel stops it at its next safe
point; nothing is deleted before the archive is written, flushed and read back (row count, SHA-256),
and only rows it holds are deleted; a failed or cancelled retention job that deleted nothing puts
its runs back as they were, and one that deleted some says how many, which, and where they lie.

The hook `between_chunks` acts where a person would: between two chunks the job commits."""

import json
import threading
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, connections
from django.urls import reverse
from django.utils import timezone

from apps.buffer import curation, expert_import, exporters, retention, services
from apps.buffer.models import BufferJob, Experience
from apps.core import jobs
from apps.core.jobs import run_job
from apps.feedback.models import Feedback
from apps.runs import services as run_services
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from tests.support import owner_died

JOBS = "/admin/buffer/bufferjob/"
ROWS, CHUNK = 50, 10  # five chunks (the finding: 51,200 rows in chunks of 10,000)


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def curator_client(client, curator):
    client.force_login(curator)
    return client


@pytest.fixture
def tasks(db):
    taskset = Taskset.objects.create(name="ts")
    return [Task.objects.create(taskset=taskset, index=i, prompt=f"{i} + {i}?", answer=str(2 * i)) for i in range(4)]


@pytest.fixture
def ended(researcher):
    """An ended run with ROWS rows that retention takes."""
    run = Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.STOPPED,
                             finished_at=timezone.now())
    Experience.objects.bulk_create(
        Experience(run=run, rollout_index=i, response_text=f"response {i}", response_ids=[i, i + 1],
                   action_mask=[1, 1], logprobs=[-0.5, -0.25], reward=1.0)
        for i in range(ROWS)
    )
    return run


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(retention, "CHUNK_ROWS", CHUNK)  # deleted a transaction
    monkeypatch.setattr(services, "CHUNK_ROWS", CHUNK)  # written a row group


def between_chunks(monkeypatch, act):
    """Call act(job, rows_done) after each progress write of the jobs run from now on: in the
    delete pass, right after a chunk's commit; in the archive pass, after a chunk is written."""
    real = jobs.progress_writer

    @contextmanager
    def observed(job):
        with real(job) as write:
            def write_then_act(rows_done, bytes_done=None):
                write(rows_done, bytes_done)
                act(job, rows_done)

            yield write_then_act

    monkeypatch.setattr(jobs, "PROGRESS_INTERVAL_SECONDS", 0)
    monkeypatch.setattr(jobs, "progress_writer", observed)


def elsewhere(request):
    """What `request()` answers when another process sends it (its own thread and database
    connection): not inside the job's transaction, as the test's own connection would be."""
    answers = []

    def send():
        try:
            answers.append(request())
        finally:
            connections.close_all()

    thread = threading.Thread(target=send)
    thread.start()
    thread.join()
    return answers[0]


def send_between_chunks(monkeypatch, client, sends, at=None) -> list[str]:
    """Once the job has done `at` rows (None: its first chunk), send each request (send(client,
    job)) from another process, as a curator would: the pages they lead to, with their messages."""
    pages = []

    def act(job, rows_done):
        if (rows_done == at if at is not None else rows_done > 0) and not pages:
            for send in sends:
                pages.append(elsewhere(lambda send=send: messages_of(client, send(client, job))))

    between_chunks(monkeypatch, act)
    return pages


def start(run, action="archive", user=None):
    return retention.start_retention(Run.objects.filter(pk=run.pk), action=action, user=user)


def left(run) -> int:
    return Experience.objects.filter(run=run).count()


def delete_single(client, job):
    return client.post(reverse("admin:buffer_bufferjob_delete", args=[job.pk]), {"post": "yes"})


def delete_bulk(client, job):
    return client.post(JOBS, {"action": "delete_selected", "_selected_action": [job.pk], "post": "yes"})


def cancel(client, job):
    return client.post(reverse("admin:buffer_bufferjob_cancel", args=[job.pk]))


def messages_of(client, response) -> str:
    return client.get(response["Location"]).content.decode()


# ---- the finding: the job deleted while it runs ----


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("delete", [delete_single, delete_bulk])
def test_deleting_the_job_during_the_delete_pass_is_refused_and_nothing_is_lost(
    ended, small_chunks, monkeypatch, curator_client, curator, delete
):
    job = start(ended, user=curator)
    pages = send_between_chunks(monkeypatch, curator_client, [delete], at=ROWS + 2 * CHUNK)  # archived, 2 deleted

    finished = run_job("buffer.bufferjob", job.pk)  # before: DatabaseError, the job row was gone

    assert f"Buffer job {job.pk} (running) has not finished" in pages[0] and "Cancel it first" in pages[0]
    job.refresh_from_db()
    assert finished.status == job.status == "succeeded" and job.result["deleted"] == ROWS
    archived = pq.read_table(job.output.path).to_pylist()
    assert sorted(row["id"] for row in archived) == sorted(job.selection), "every deleted row is in the archive"
    ended.refresh_from_db()
    assert ended.buffer_retirement == {"action": "archive", "job": job.pk}


@pytest.mark.django_db(transaction=True)
def test_deleting_the_job_during_the_archive_pass_is_refused(ended, small_chunks, monkeypatch, curator_client,
                                                            curator):
    job = start(ended, user=curator)
    pages = send_between_chunks(monkeypatch, curator_client, [delete_single, delete_bulk], at=CHUNK)

    run_job("buffer.bufferjob", job.pk)

    assert all("has not finished" in page for page in pages)
    assert BufferJob.objects.filter(pk=job.pk, status="succeeded").exists()
    assert left(ended) == 0 and Path(BufferJob.objects.get().output.path).is_file()


# ---- Cancel instead: stopped between chunks, and said what went ----


@pytest.mark.django_db(transaction=True)
def test_cancel_during_the_delete_pass_stops_between_chunks_keeps_the_checked_archive_and_says_what_went(
    ended, small_chunks, monkeypatch, curator_client, curator
):
    job = start(ended, user=curator)
    pages = send_between_chunks(monkeypatch, curator_client, [cancel], at=ROWS + 2 * CHUNK)

    run_job("buffer.bufferjob", job.pk)

    assert "stops at its next safe point" in pages[0]
    job.refresh_from_db()
    assert job.status == "cancelled" and job.result["deleted"] == 2 * CHUNK and left(ended) == ROWS - 2 * CHUNK
    archive = Path(job.output.path)
    assert exporters.sha256(archive) == job.result["archive_sha256"]
    assert sorted(exporters.read_ids(archive)) == sorted(job.selection), "the archive holds every selected row"
    gone = set(job.selection) - set(Experience.objects.values_list("pk", flat=True))
    assert gone == set(sorted(job.selection)[: 2 * CHUNK]), "exactly the first two chunks went"
    through = sorted(job.selection)[2 * CHUNK - 1]
    assert (f"{2 * CHUNK} of the {ROWS} selected rows were deleted (those that could go among the selected ids "
            f"up to {through}), all of them in its archive {job.output.name} ({ROWS} rows, SHA-256 "
            f"{job.result['archive_sha256']}, read back before the first delete") in job.error
    ended.refresh_from_db()
    assert ended.buffer_retired_at is not None and ended.buffer_retirement == {
        "action": "archive", "job": job.pk, "state": "partial", "stopped": "cancelled", "deleted": 2 * CHUNK,
        "archive": job.output.name,
    }
    with pytest.raises(run_services.InvalidTransition):
        run_services.resume_run(ended)  # its trainer would replay rows that are gone
    page = curator_client.get(reverse("admin:buffer_bufferjob_change", args=[job.pk])).content.decode()
    assert "cancelled" in page and "Cancel this job" not in page
    assert reverse("admin:buffer_bufferjob_download", args=[job.pk]) in page and "deleted by run: #" in page


@pytest.mark.django_db(transaction=True)
def test_cancel_during_the_archive_pass_deletes_nothing_and_puts_the_run_back(
    ended, small_chunks, monkeypatch, curator_client, curator, media_root
):
    job = start(ended, user=curator)
    ended.refresh_from_db()
    assert ended.buffer_retired_at is not None and ended.buffer_retirement["state"] == "in progress"
    send_between_chunks(monkeypatch, curator_client, [cancel], at=CHUNK)

    run_job("buffer.bufferjob", job.pk)

    job.refresh_from_db()
    assert job.status == "cancelled" and left(ended) == ROWS and not job.output
    assert not list(media_root.glob("buffer-jobs/*")), "no half-written archive stays"
    assert job.error == f"cancelled on request, after {CHUNK} of {ROWS} archived rows; nothing was deleted: " \
        f"run #{ended.pk} is as it was before this job"
    ended.refresh_from_db()
    assert ended.buffer_retired_at is None and ended.buffer_retirement == {}, "resumable again"


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_drop_says_the_rows_went_without_an_archive(ended, small_chunks, monkeypatch, curator_client,
                                                                curator):
    job = start(ended, action="drop", user=curator)
    send_between_chunks(monkeypatch, curator_client, [cancel], at=CHUNK)

    run_job("buffer.bufferjob", job.pk)

    job.refresh_from_db()
    assert job.status == "cancelled" and left(ended) == ROWS - CHUNK
    assert f"{CHUNK} of the {ROWS} selected rows were deleted" in job.error
    assert "dropped without an archive" in job.error
    ended.refresh_from_db()
    assert ended.buffer_retirement["deleted"] == CHUNK and ended.buffer_retirement["archive"] is None


def test_a_queued_job_is_cancelled_at_once_and_its_runs_are_as_before(ended, curator_client, curator):
    first = start(ended, action="drop")  # retired before by another job, which deleted some of its rows
    Run.objects.filter(pk=ended.pk).update(buffer_retirement={"action": "drop", "job": first.pk, "state": "partial"})
    BufferJob.objects.filter(pk=first.pk).update(status="cancelled")
    ended.refresh_from_db()
    before = (ended.buffer_retired_at, ended.buffer_retirement)
    job = start(ended, action="archive", user=curator)

    answer = cancel(curator_client, job)

    assert "was cancelled before it started" in messages_of(curator_client, answer)
    job.refresh_from_db()
    assert job.status == "cancelled" and job.finished_at is not None and job.started_at is None
    assert run_job("buffer.bufferjob", job.pk).status == "cancelled", "its task, arriving later, leaves it"
    assert left(ended) == ROWS
    ended.refresh_from_db()
    assert (ended.buffer_retired_at, ended.buffer_retirement) == before


# ---- nothing deleted before the archive is checked, and only what it holds ----


@pytest.mark.django_db(transaction=True)
def test_an_archive_that_does_not_read_back_whole_fails_the_job_before_any_delete(ended, small_chunks, monkeypatch,
                                                                                   curator):
    real = exporters.read_ids
    monkeypatch.setattr(exporters, "read_ids", lambda path: real(path)[:-1])  # a row lost on the way to the disk
    job = start(ended, user=curator)

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "failed" and left(ended) == ROWS
    assert f"reads back {ROWS - 1} distinct rows, not the {ROWS} written: nothing was deleted" in job.error
    ended.refresh_from_db()
    assert ended.buffer_retired_at is None


@pytest.mark.django_db(transaction=True)
def test_a_rerun_finds_the_archive_changed_and_deletes_nothing_more(ended, small_chunks, monkeypatch, curator):
    class Killed(BaseException):
        pass

    def killed_after_two_chunks(job, rows_done):
        if rows_done == ROWS + 2 * CHUNK:
            raise Killed

    between_chunks(monkeypatch, killed_after_two_chunks)
    job = start(ended, user=curator)
    with pytest.raises(Killed):
        run_job("buffer.bufferjob", job.pk)
    owner_died(job)
    job.refresh_from_db()
    with open(job.output.path, "r+b") as archive:  # one byte changed on the disk
        archive.seek(100)
        byte = archive.read(1)
        archive.seek(100)
        archive.write(bytes([byte[0] ^ 1]))

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "failed" and "has changed since it was written" in job.error
    assert left(ended) == ROWS - 2 * CHUNK and f"{2 * CHUNK} of the {ROWS} selected rows were deleted" in job.error
    ended.refresh_from_db()
    assert ended.buffer_retirement["state"] == "partial" and ended.buffer_retirement["deleted"] == 2 * CHUNK


def test_a_row_whose_feedback_went_after_the_archive_was_written_stays(ended, monkeypatch, annotator):
    """It was not archived (it had feedback then); deleting it now would lose it."""
    job = start(ended)
    rated = Experience.objects.filter(run=ended).order_by("pk").last()
    feedback = Feedback.objects.create(experience=rated, user=annotator, kind="rating", value=1.0)
    real_delete = retention._delete

    def feedback_removed_between_the_passes(*args):
        feedback.delete()
        return real_delete(*args)

    monkeypatch.setattr(retention, "_delete", feedback_removed_between_the_passes)

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and job.result["deleted"] == ROWS - 1 and job.result["kept_not_archived"] == 1
    assert list(Experience.objects.values_list("pk", flat=True)) == [rated.pk]


# ---- the other kinds of buffer job: not deleted while they run, cancelled with nothing changed ----


def rows_of(run):
    return Experience.objects.filter(run=run).order_by("pk")


KINDS = {
    # kind: (start it on the run's rows, what the buffer looks like: unchanged once it is cancelled)
    "export": (lambda run, user: services.start_export(rows_of(run), fmt="jsonl", user=user),
               lambda run: sorted(path.name for path in Path(run.media).glob("buffer-jobs/*"))),
    "rescore": (lambda run, user: curation.start_rescore(rows_of(run), reward_fn="exact_match", user=user),
                lambda run: list(rows_of(run).values_list("reward", "metadata"))),
    "promote": (lambda run, user: curation.start_promotion(rows_of(run), user=user),
                lambda run: Experience.objects.count()),
    "pipeline": (lambda run, user: curation.start_pipeline(rows_of(run), operator="dedupe", params={}, user=user),
                 lambda run: list(rows_of(run).values_list("status", flat=True))),
    "import": (lambda run, user: expert_import.start_import(  # two batches: the job reads the batch size once
        upload=SimpleUploadedFile("expert.jsonl", "".join(
            json.dumps({"prompt": f"p{i}", "response": f"r{i}"}) + "\n"
            for i in range(settings.IMPORT_BATCH_ROWS + 1)
        ).encode()),
        layout="sft", fmt="jsonl", user=user),
        lambda run: Experience.objects.count()),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_running_job_of_any_kind_is_refused_deletion_and_cancelled_with_nothing_changed(
    kind, ended, tasks, small_chunks, monkeypatch, curator_client, curator, media_root
):
    for i, row in enumerate(rows_of(ended)):  # tasks of their own, each with duplicate answers (dedupe)
        Experience.objects.filter(pk=row.pk).update(task=tasks[i % len(tasks)], response_ids=[7, 7])
    ended.media = media_root
    begin, looks = KINDS[kind]
    before = looks(ended)
    job = begin(ended, curator)
    pages = send_between_chunks(monkeypatch, curator_client, [delete_single, delete_bulk, cancel])

    job = run_job("buffer.bufferjob", job.pk)

    deleted_single, deleted_bulk, cancelled = pages
    assert "has not finished" in deleted_single and "has not finished" in deleted_bulk
    if connection.vendor == "sqlite" and kind == "pipeline":
        # Embedded, one writer at a time: the job's transaction holds the lock until it ends (an
        # import commits a batch at a time: expert_import.py; a re-score and a promotion a chunk).
        assert "could not be cancelled now, the database is busy with its writes" in cancelled
        assert job.status == "succeeded"
        return
    assert "stops at its next safe point" in cancelled
    assert job.status == "cancelled" and job.error.startswith("cancelled on request, after ")
    if kind in ("rescore", "promote"):
        # They commit a chunk at a time (curation._rescore says why): the chunk done before the
        # cancel stays, each rescored row saying so, each copy pointing to its original.
        done = rows_of(ended).filter(metadata__rescored__job=job.pk) if kind == "rescore" else (
            Experience.objects.filter(source="expert", parent__run=ended))
        assert done.count() == CHUNK
        return
    assert looks(ended) == before and not job.output and not job.upload
    assert not list(media_root.glob("buffer-jobs/*")), "no file of it is left"
    assert services.delete_jobs(BufferJob.objects.filter(pk=job.pk)) == 1, "deleted once it has finished"


@pytest.mark.django_db(transaction=True)
def test_deleting_a_finished_archive_job_keeps_its_archive(ended, curator_client, curator):
    """The archive is the only copy of the rows the job deleted: deleting the job's record keeps it.
    The confirmation says so, and the run's page names the file where it linked to the job (it
    linked to a job that no longer existed, the archive's only trace: a review found it)."""
    job = start(ended, user=curator)
    run_job("buffer.bufferjob", job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded" and left(ended) == 0
    archive = Path(job.output.path)
    asked = curator_client.get(reverse("admin:buffer_bufferjob_delete", args=[job.pk])).content.decode()
    assert f"Not the retention archive {job.output.name}: it stays under the data dir" in asked
    page = messages_of(curator_client, delete_single(curator_client, job))
    assert not BufferJob.objects.filter(pk=job.pk).exists()
    assert archive.exists() and len(exporters.read_ids(archive)) == ROWS
    assert f"Kept the retention archive {job.output.name}" in page
    ended.refresh_from_db()
    assert ended.buffer_retirement == {"action": "archive", "job": None, "archive": job.output.name}
    curator_client.force_login(ended.owner)
    run_page = curator_client.get(reverse("run-detail", args=[ended.pk])).content.decode()
    assert f"its archive is the file {job.output.name} under the data directory" in run_page
    assert reverse("admin:buffer_bufferjob_change", args=[job.pk]) not in run_page
    archive.unlink()


# ---- the finding as it happened: a Celery worker, chunks of 10,000 rows ----


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_on_a_worker_the_running_job_is_cancelled_not_deleted(researcher, celery_worker_factory, curator_client,
                                                              curator, settings):
    from django.db import DEFAULT_DB_ALIAS

    from tests.support import wait_for

    settings.MEDIA_ROOT = settings.DATA_DIR / "uploads"  # where the worker writes the archive
    chunk = retention.CHUNK_ROWS
    rows = 3 * chunk + 1_200  # a fourth chunk for Cancel to spare (the finding's run: 51,200 rows, 85 s here)
    run = Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.STOPPED,
                             finished_at=timezone.now())
    Experience.objects.bulk_create((Experience(run=run, rollout_index=i, response_text=f"r{i}", response_ids=[i],
                                               action_mask=[1], logprobs=[-0.5]) for i in range(rows)),
                                   batch_size=5_000)
    ids = sorted(Experience.objects.values_list("pk", flat=True))
    celery_worker_factory(queues="default")
    # A row of the third chunk, locked elsewhere: the worker waits there, two chunks deleted, as
    # long as the curator needs (the finding's "while the delete pass ran").
    holder = connections.create_connection(DEFAULT_DB_ALIAS)
    holder.set_autocommit(False)
    with holder.cursor() as cursor:
        cursor.execute("SELECT id FROM buffer_experience WHERE id = %s FOR UPDATE", [ids[2 * chunk]])
    try:
        job = start(run, user=curator)
        wait_for(lambda: BufferJob.objects.get(pk=job.pk).result.get("checked") == 2 * chunk, timeout=240,
                 what="two chunks deleted")

        refused = [messages_of(curator_client, send(curator_client, job)) for send in (delete_single, delete_bulk)]
        asked = messages_of(curator_client, cancel(curator_client, job))
    finally:
        holder.rollback()
        holder.close()
    job = wait_for(lambda: BufferJob.objects.filter(pk=job.pk, status="cancelled").first(), timeout=120,
                   what="the job cancelled")

    assert all("has not finished" in page for page in refused) and "stops at its next safe point" in asked
    assert job.result["deleted"] == 3 * chunk, "the chunk under way when Cancel came is finished, no more"
    assert Experience.objects.count() == rows - 3 * chunk
    archive = Path(job.output.path)
    assert exporters.sha256(archive) == job.result["archive_sha256"] and len(exporters.read_ids(archive)) == rows
    run.refresh_from_db()
    assert run.buffer_retirement["state"] == "partial" and run.buffer_retirement["deleted"] == 3 * chunk
    assert run.buffer_retirement["archive"] == job.output.name
    # Deleting the finished job keeps the archive: the only copy of the rows it deleted.
    page = messages_of(curator_client, delete_single(curator_client, job))
    assert not BufferJob.objects.filter(pk=job.pk).exists() and archive.exists()
    assert f"Kept the retention archive {job.output.name}" in page
    archive.unlink()
