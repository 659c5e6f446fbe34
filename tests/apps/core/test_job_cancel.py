"""Cancelling a job (#41, apps.core.jobs.cancel_job): a pending job at once, a running one at its
type's next safe point; never a finished one, nor a running one whose type cannot stop safely. A
job that has not finished is never deleted (jobs.refuse_unfinished, apps.core.job_admin)."""

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.urls import reverse

from apps.buffer.models import BufferJob, Experience
from apps.core import jobs
from apps.core.jobs import JobError
from apps.tasksets.models import Taskset

PROMOTE = "buffer.promote"  # the type the toy jobs below stand in for


@pytest.fixture
def toy(db, monkeypatch):
    """toy(steps, during=None): a promote job whose type takes `steps` steps, each a progress
    report then a safe point; during(job, step) runs after each step's progress."""

    def make(steps, during=None):
        def run(job, progress):
            for step in range(1, steps + 1):
                progress(step)
                if during:
                    during(job, step)
                jobs.stop_if_cancelled(job)
            return {"promoted": steps}

        monkeypatch.setitem(jobs.JOB_TYPES, PROMOTE, run)
        return BufferJob.objects.create(kind=BufferJob.Kind.PROMOTE, rows_total=steps)

    return make


def refreshed(job):
    return type(job).objects.get(pk=job.pk)


# ---- what a cancel does ----


def test_a_pending_job_is_cancelled_at_once_and_its_task_leaves_it(researcher, start_taskset_import):
    job = start_taskset_import(researcher)
    upload = job.upload.path

    job = jobs.cancel_job(job)

    assert (job.status, job.error) == ("cancelled", "cancelled before it started")
    assert job.cancel_requested_at is not None and job.finished_at is not None and not job.upload
    assert jobs.run_job("tasksets.tasksetimport", job.pk).status == "cancelled"
    assert refreshed(job).started_at is None and not Taskset.objects.exists()
    assert not Path(upload).exists(), "its upload goes, as a finished import's does"


def test_a_running_job_stops_at_its_next_safe_point(toy):
    job = toy(5, during=lambda job, step: step == 2 and jobs.cancel_job(job))

    job = jobs.run_job("buffer.bufferjob", job.pk)

    assert (job.status, job.error, job.result) == ("cancelled", "cancelled on request, after 2 of 5 rows", {})
    assert refreshed(job).cancel_requested_at is not None


def test_a_cancel_after_the_last_safe_point_finds_the_job_succeeded_and_stays_on_record(toy, monkeypatch):
    job = toy(3)

    def run(job, progress):
        jobs.stop_if_cancelled(job)  # its last safe point
        jobs.cancel_job(job)  # a curator, a moment too late: the worker's copy of the job never sees it
        return {"promoted": 3}

    monkeypatch.setitem(jobs.JOB_TYPES, PROMOTE, run)

    job = jobs.run_job("buffer.bufferjob", job.pk)

    stored = refreshed(job)
    assert stored.status == "succeeded" and stored.cancel_requested_at is not None, "the finish kept the request"


def test_a_finished_job_is_not_cancelled(curator):
    job = BufferJob.objects.create(kind=BufferJob.Kind.EXPORT, status="succeeded")
    with pytest.raises(JobError, match=rf"^buffer job {job.pk} has already finished \(succeeded\): there is nothing"):
        jobs.cancel_job(job)
    assert refreshed(job).cancel_requested_at is None


def test_a_running_job_of_a_type_that_cannot_stop_safely_is_refused(toy, monkeypatch, run_here):
    monkeypatch.setattr(jobs, "CANCELLABLE", jobs.CANCELLABLE - {PROMOTE})  # every product type can stop now
    job = run_here(toy(3))
    assert not jobs.cancellable(job)
    with pytest.raises(JobError, match="is running and cannot be stopped safely before it ends"):
        jobs.cancel_job(job)
    assert refreshed(job).cancel_requested_at is None and refreshed(job).status == "running"


def test_a_running_taskset_import_cancelled_leaves_nothing_of_it(researcher, start_taskset_import, monkeypatch):
    """The import commits batch by batch into a hidden taskset; the cancel is read after each
    batch, and the taskset deleted with what it holds (tests/apps/tasksets/test_import_chunks.py)."""
    from apps.tasksets import services as taskset_services

    job = start_taskset_import(researcher, rows=[{"q": f"q{i}", "a": str(i)} for i in range(50)])
    import_taskset = taskset_services.import_taskset

    def in_batches_of_ten(*args, **kwargs):
        return import_taskset(*args, **{**kwargs, "batch_size": 10})

    monkeypatch.setattr(taskset_services, "import_taskset", in_batches_of_ten)
    seen = []
    stop_if_cancelled = jobs.stop_if_cancelled

    def cancel_after_two_batches(running):
        seen.append(running.pk)
        if len(seen) == 3:  # the runner's check before it starts, then after the first two batches
            jobs.cancel_job(running)
        stop_if_cancelled(running)

    monkeypatch.setattr(jobs, "stop_if_cancelled", cancel_after_two_batches)
    job = jobs.run_job("tasksets.tasksetimport", job.pk)

    assert job.status == "cancelled" and job.error.startswith("cancelled on request"), job.error
    assert not Taskset.all_objects.filter(name="uploaded").exists(), "nothing of the import is kept"
    assert len(seen) == 3, "it stopped at the check after the cancel"


def test_a_rerun_of_a_job_cancelled_while_its_worker_was_gone_stops_before_it_starts(toy):
    steps = []
    job = toy(3, during=lambda job, step: steps.append(step))
    BufferJob.objects.filter(pk=job.pk).update(status="running")  # its worker was killed
    jobs.cancel_job(job)

    job = jobs.run_job("buffer.bufferjob", job.pk)

    assert job.status == "cancelled" and steps == []


# ---- what a job type puts back when it stops ----


def test_the_stop_hook_runs_when_a_job_fails_or_is_cancelled_not_when_it_succeeds(toy, monkeypatch):
    stopped = []
    monkeypatch.setitem(jobs.STOP_HOOKS, PROMOTE, lambda job: stopped.append(job.status))

    jobs.run_job("buffer.bufferjob", toy(2).pk)
    jobs.run_job("buffer.bufferjob", toy(2, during=lambda job, step: jobs.cancel_job(job)).pk)
    jobs.cancel_job(toy(2))

    def fails(job, step):
        raise JobError("row 1 is bad")

    jobs.run_job("buffer.bufferjob", toy(2, during=fails).pk)

    assert stopped == ["cancelled", "cancelled", "failed"]


def test_a_stop_hook_that_fails_still_ends_the_job_saying_so(toy, monkeypatch):
    def broken(job):
        raise RuntimeError("database away")

    monkeypatch.setitem(jobs.STOP_HOOKS, PROMOTE, broken)

    job = jobs.run_job("buffer.bufferjob", toy(3, during=lambda job, step: jobs.cancel_job(job)).pk)

    assert refreshed(job).status == "cancelled"
    assert refreshed(job).error == ("cancelled on request, after 1 of 3 rows; what it changed could not be put "
                                    "back (RuntimeError('database away'))")


# ---- what its page shows ----


def test_the_progress_endpoint_shows_a_cancel_under_way(curator, client, toy, run_here):
    client.force_login(curator)
    job = run_here(toy(3))
    url = reverse("job-progress", args=["buffer.bufferjob", job.pk])
    assert client.get(url).json()["cancellable"] is True

    jobs.cancel_job(job)

    shown = client.get(url).json()
    assert (shown["status"], shown["cancel_requested"], shown["cancellable"], shown["finished"]) == (
        "running", True, True, False)
    assert shown["status_text"] == "running, cancelling (stops at its next safe point)"
    BufferJob.objects.filter(pk=job.pk).update(status="cancelled")
    shown = client.get(url).json()
    assert (shown["status_text"], shown["cancellable"], shown["finished"]) == ("cancelled", False, True)


@pytest.mark.django_db(transaction=True)
def test_a_progress_write_brings_back_the_cancel_request_for_the_live_message(toy, monkeypatch, run_here):
    """On Postgres, outside a transaction, progress goes through a second connection: its write
    returns the cancel request, so live messages show it before the job reaches its safe point."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no second connection for progress: a job's page sees it when it ends")
    sent = []
    monkeypatch.setattr(jobs, "PROGRESS_INTERVAL_SECONDS", 0)
    monkeypatch.setattr(jobs, "_send", lambda group, payload: sent.append(payload))
    job = run_here(toy(3))

    with jobs.progress_writer(job) as progress:
        progress(1)
        jobs.cancel_job(job)
        progress(2)

    first, last = sent[0], sent[-1]  # the writes' messages (cancel_job's own is between them)
    assert (first["rows_done"], first["cancel_requested"]) == (1, False)
    assert (last["rows_done"], last["cancel_requested"]) == (2, True) and job.cancel_requested_at is not None


# ---- never deleted before it has finished ----


def test_deleting_unfinished_jobs_is_refused_naming_them(curator):
    running = BufferJob.objects.create(kind=BufferJob.Kind.EXPORT, status="running")
    pending = BufferJob.objects.create(kind=BufferJob.Kind.EXPORT)
    done = BufferJob.objects.create(kind=BufferJob.Kind.EXPORT, status="failed")

    with pytest.raises(JobError) as refused:
        jobs.refuse_unfinished(BufferJob.objects.all())
    assert str(refused.value) == (
        f"buffer jobs {running.pk} (running), {pending.pk} (pending) have not finished: a job is deleted once it "
        "has finished. Cancel it first (it stops at its next safe point), then delete it. Nothing was deleted.")
    with pytest.raises(JobError, match=rf"^buffer job {pending.pk} \(pending\) has not finished"):
        jobs.refuse_unfinished([pending])
    jobs.refuse_unfinished([done])


def test_the_admin_offers_cancel_not_delete_while_a_job_runs(client, curator, django_user_model, toy, run_here):
    job = run_here(toy(3))
    page_url = reverse("admin:buffer_bufferjob_change", args=[job.pk])
    cancel_url = reverse("admin:buffer_bufferjob_cancel", args=[job.pk])
    delete_url = reverse("admin:buffer_bufferjob_delete", args=[job.pk])
    client.force_login(curator)

    page = client.get(page_url).content.decode()
    assert cancel_url in page and "Cancel this job" in page and delete_url not in page
    assert client.get(cancel_url).status_code == 405, "a change: POST only"
    form = client.get("/admin/buffer/bufferjob/").context["action_form"]
    choices = {name for name, _ in form.fields["action"].choices}
    assert {"delete_selected", "cancel_selected"} <= choices

    viewer = django_user_model.objects.create_user("viewer", password="pw-for-tests-123", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_bufferjob"))
    client.force_login(viewer)
    assert cancel_url not in client.get(page_url).content.decode()
    assert client.post(cancel_url).status_code == 403 and refreshed(job).cancel_requested_at is None
    client.post("/admin/buffer/bufferjob/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert refreshed(job).cancel_requested_at is None

    client.force_login(curator)
    answer = client.post("/admin/buffer/bufferjob/", {"action": "cancel_selected", "_selected_action": [job.pk]})
    assert "stops at its next safe point" in client.get(answer["Location"]).content.decode()
    page = client.get(page_url).content.decode()
    assert "Cancelling…" in page and "disabled" in page
    BufferJob.objects.filter(pk=job.pk).update(status="cancelled")
    page = client.get(page_url).content.decode()
    assert cancel_url not in page and delete_url in page
    again = client.post(cancel_url)
    assert "has already finished (cancelled)" in client.get(again["Location"]).content.decode()
    assert client.post(delete_url, {"post": "yes"}).status_code == 302 and not BufferJob.objects.exists()
    assert not Experience.objects.exists()


def test_a_job_deleted_by_other_means_while_it_ran_ends_without_coming_back(toy, caplog):
    """Not through its admin (refused there): a shell, a cascade. Before, its end saved it again or
    failed the worker with "Save with update_fields did not affect any rows"."""
    job = toy(2, during=lambda job, step: step == 1 and BufferJob.objects.filter(pk=job.pk).delete())

    job = jobs.run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded" and not BufferJob.objects.exists()
    assert f"job buffer.bufferjob {job.pk} was deleted while it ran; it ended succeeded" in caplog.text
