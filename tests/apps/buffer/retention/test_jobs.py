"""Buffer retention jobs (#29, apps/buffer/retention.py): what a job deletes and keeps, its archive, its
progress, runs that have not ended, and a rerun of an interrupted job (a commit a chunk).

How jobs are started (the sweep, the admin) and what a retired run refuses: test_controls.py."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.urls import reverse

from apps.buffer import exporters, retention, services
from apps.buffer.models import BufferJob, Experience
from apps.core import jobs
from apps.core.jobs import run_job
from apps.feedback.models import AnnotationLock, Feedback
from apps.runs.models import Run
from tests.apps.buffer.retention.support import ids, remaining, retire
from tests.support import owner_died, read_elsewhere, watch_progress

Status = Run.Status


# ---- what goes, what stays ----


def test_drop_deletes_exactly_the_droppable_rows(ended, buffer):
    job = retire(ended, "drop")

    assert remaining() == ids(buffer["kept"])
    assert job.result == {"deleted": len(buffer["doomed"]), "kept_human_edits": 1, "kept_with_feedback": 4}
    assert Feedback.objects.count() == 3 and not AnnotationLock.objects.exists()
    buffer["edit"].refresh_from_db()
    assert buffer["edit"].parent_id is None  # SET_NULL, as delete_experiences does
    assert not job.output
    ended.refresh_from_db()
    assert ended.buffer_retired_at is not None and ended.buffer_retirement == {"action": "drop", "job": job.pk}
    buffer["other_run"].refresh_from_db()
    assert buffer["other_run"].buffer_retired_at is None


def test_archive_writes_the_deleted_rows_then_deletes_them(ended, buffer, curator_client):
    expected = {row.pk: exporters.experience_record(row) for row in buffer["doomed"]}

    job = retire(ended, "archive")

    assert remaining() == ids(buffer["kept"])
    assert job.result["archived"] == job.result["deleted"] == len(expected)
    archived = pq.read_table(job.output.path).to_pylist()
    assert {row["id"] for row in archived} == set(expected)
    for row in archived:
        want = expected[row["id"]]
        for column in ("run", "task", "source", "status", "prompt", "response", "response_ids", "action_mask",
                       "logprobs", "reward", "group_id", "explorer_step"):
            assert row[column] == want[column], column
    # Downloaded from its job page, as an export is.
    page = curator_client.get(reverse("admin:buffer_bufferjob_change", args=[job.pk])).content.decode()
    download_url = reverse("admin:buffer_bufferjob_download", args=[job.pk])
    assert download_url in page and f"archive the buffer of run #{ended.pk}" in page
    assert f"deleted: {len(expected)}" in page
    download = curator_client.get(download_url)
    assert download.status_code == 200 and b"".join(download) == Path(job.output.path).read_bytes()


def test_feedback_given_after_the_job_was_queued_keeps_its_row(ended, buffer, annotator):
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    late = buffer["doomed"][0]
    Feedback.objects.create(experience=late, user=annotator, kind="rating", value=0.5)

    job = run_job("buffer.bufferjob", job.pk)

    assert late.pk in remaining() and Feedback.objects.filter(experience=late).exists()
    assert late.pk not in {row["id"] for row in pq.read_table(job.output.path).to_pylist()}
    assert job.result["archived"] == job.result["deleted"] == len(buffer["doomed"]) - 1


@pytest.mark.parametrize("action, factor", [("drop", 1), ("archive", 2)])
def test_progress_goes_up_to_rows_total(ended, buffer, monkeypatch, action, factor):
    monkeypatch.setattr(retention, "CHUNK_ROWS", 2)
    monkeypatch.setattr(services, "CHUNK_ROWS", 2)
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action=action)
    assert job.rows_total == factor * len(buffer["doomed"])  # an archived row is written, then deleted
    seen = []

    jobs.JOB_TYPES["buffer.retention"](job, lambda rows, bytes_done=None: seen.append(rows))

    assert seen == sorted(seen) and seen[-1] == job.rows_total and len(set(seen)) > 3
    assert remaining() == ids(buffer["kept"])


def test_an_archiving_jobs_rows_are_counted_once_in_words(ended, buffer):
    """rows_total counts both passes of an archive (write, then delete); what the page says counts rows."""
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    n = len(buffer["doomed"])
    words = []
    for done in (0, 1, n, n + 1, 2 * n):
        job.rows_done = done
        words.append(job.rows_text)
    assert words == [
        f"0 of {n} archived", f"1 of {n} archived", f"{n} archived, 0 of {n} deleted",
        f"{n} archived, 1 of {n} deleted", f"{n} archived, {n} of {n} deleted",
    ]
    assert jobs.snapshot(job)["rows_text"] == words[-1]


# ---- runs that have not ended ----


@pytest.mark.parametrize("status", [Status.QUEUED, Status.STARTING, Status.RUNNING, Status.PAUSED, Status.STOPPING])
def test_a_run_that_has_not_ended_is_refused_and_untouched(make_run, make_experience, ended, status):
    active = make_run("busy", status=status)
    rows = ids([make_experience(run=active) for _ in range(3)] + [make_experience(run=ended)])

    with pytest.raises(retention.RetentionRefused, match=rf"busy \(#{active.pk}, {status}\)"):
        retention.start_retention(Run.objects.filter(pk__in=[active.pk, ended.pk]), action="drop")

    assert remaining() == rows and not BufferJob.objects.exists()
    assert not Run.objects.filter(buffer_retired_at__isnull=False).exists()


def test_the_job_touches_only_runs_it_retired(ended, buffer, make_experience):
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="drop")
    # A newer retention job took the run over (this one failed, the sweep started another): the
    # old one, redelivered, leaves it to that one.
    Run.objects.filter(pk=ended.pk).update(buffer_retirement={"action": "drop", "job": job.pk + 1})

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and job.result["deleted"] == 0 and job.result["runs_skipped"] == 1
    assert ids(buffer["doomed"]) <= remaining()


def test_a_run_in_a_queued_retention_job_is_refused(ended, buffer):
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    with pytest.raises(retention.RetentionRefused, match=rf"a retention job \(#{job.pk}\) is already queued"):
        retention.start_retention(Run.objects.filter(pk=ended.pk), action="drop")
    assert BufferJob.objects.get() == job


def test_nothing_to_retire_is_refused(ended, make_experience, annotator):
    make_experience(source=Experience.Source.HUMAN_EDIT)
    Feedback.objects.create(experience=make_experience(), user=annotator, kind="flag")
    with pytest.raises(retention.RetentionRefused, match="nothing to archive"):
        retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    ended.refresh_from_db()
    assert ended.buffer_retired_at is None


# ---- a rerun of an interrupted job ----


class Killed(BaseException):
    """A worker killed mid-job: not an error the job runner sees, the job stays running."""

@pytest.mark.parametrize("action", ["drop", "archive"])
def test_a_rerun_of_a_job_killed_while_deleting_finishes_the_rest(ended, buffer, monkeypatch, action):
    monkeypatch.setattr(retention, "CHUNK_ROWS", 2)
    delete_rows, calls = services.delete_rows, []

    def dies_on_the_third_chunk(rows):
        calls.append(rows)
        if len(calls) == 3:
            raise Killed
        return delete_rows(rows)

    monkeypatch.setattr(services, "delete_rows", dies_on_the_third_chunk)
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action=action)
    with pytest.raises(Killed):
        run_job("buffer.bufferjob", job.pk)
    owner_died(job)
    job.refresh_from_db()
    assert job.status == "running" and job.result["deleted"] == 4 and job.result["checked"] == 4
    archive = job.output.name and Path(job.output.path).read_bytes()
    droppable, chunks = retention.droppable, []
    monkeypatch.setattr(retention, "droppable", lambda rows: chunks.append(rows) or droppable(rows))

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and job.result["deleted"] == len(buffer["doomed"])
    assert remaining() == ids(buffer["kept"])
    assert len(chunks) == 1 and len(calls) == 3 + 1, "the rerun starts at the chunk that was cut off"
    if action == "archive":
        assert Path(job.output.path).read_bytes() == archive, "the archive written before is kept"
        assert {row["id"] for row in pq.read_table(job.output.path).to_pylist()} == ids(buffer["doomed"])


def test_a_rerun_of_a_job_killed_while_archiving_writes_the_archive_again(ended, buffer, monkeypatch, media_root):
    monkeypatch.setattr(services, "CHUNK_ROWS", 2)
    write, writes = exporters.ParquetWriter.write, []

    def dies_on_the_second_chunk(self, records):
        writes.append(len(records))
        if len(writes) == 2:
            raise Killed
        return write(self, records)

    monkeypatch.setattr(exporters.ParquetWriter, "write", dies_on_the_second_chunk)
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    with pytest.raises(Killed):
        run_job("buffer.bufferjob", job.pk)
    owner_died(job)
    assert remaining() >= ids(buffer["doomed"]), "nothing is deleted before the archive is whole"
    assert not list(media_root.glob("buffer-jobs/*"))

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and remaining() == ids(buffer["kept"])
    assert {row["id"] for row in pq.read_table(job.output.path).to_pylist()} == ids(buffer["doomed"])
    assert len(list(media_root.glob("buffer-jobs/*"))) == 1


def test_a_job_that_fails_after_archiving_keeps_its_archive(ended, buffer, monkeypatch):
    def broken(rows):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(services, "delete_rows", broken)
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    with pytest.raises(RuntimeError):
        run_job("buffer.bufferjob", job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and "disk on fire" in job.error
    assert {row["id"] for row in pq.read_table(job.output.path).to_pylist()} == ids(buffer["doomed"])


def test_a_rerun_whose_archive_is_gone_deletes_nothing_more(ended, buffer, monkeypatch):
    monkeypatch.setattr(retention, "CHUNK_ROWS", 2)
    delete_rows = services.delete_rows

    def killed(rows):
        raise Killed

    monkeypatch.setattr(services, "delete_rows", killed)
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="archive")
    with pytest.raises(Killed):
        run_job("buffer.bufferjob", job.pk)
    owner_died(job)
    monkeypatch.setattr(services, "delete_rows", delete_rows)
    job.refresh_from_db()
    Path(job.output.path).unlink()

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "failed" and "archive of this job" in job.error and "is gone" in job.error
    assert ids(buffer["doomed"]) <= remaining()


# ---- outside a test transaction: a commit a chunk ----


@pytest.mark.django_db(transaction=True)
def test_each_chunk_is_committed_and_its_progress_shown_as_it_goes(ended, buffer, monkeypatch):
    monkeypatch.setattr(retention, "CHUNK_ROWS", 2)
    doomed = [row.pk for row in buffer["doomed"]]
    listed = ", ".join(["%s"] * len(doomed))  # not = ANY(%s): one form for Postgres and SQLite
    seen = watch_progress(monkeypatch, lambda job: read_elsewhere(
        f"SELECT j.rows_done, (SELECT count(*) FROM buffer_experience WHERE id IN ({listed})) "
        "FROM buffer_bufferjob j WHERE j.id = %s", [*doomed, job.pk]))
    job = retention.start_retention(Run.objects.filter(pk=ended.pk), action="drop")

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and seen == [(0, 6), (2, 4), (4, 2), (6, 0)]
    assert remaining() == ids(buffer["kept"])
