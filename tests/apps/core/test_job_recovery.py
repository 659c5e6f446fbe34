"""Jobs whose process died (apps.core.job_owners, jobs.rerun_orphaned, jobs.cancel_job).

Embedded, a job runs on a thread of the server: a server killed mid-import left the job `running`
for good, its progress bar still, its Cancel a request nobody would read, and its hidden taskset
holding the name ("is being imported"). Now the process that claims a job is recorded, the demo
server's watchdog runs again each job nobody runs, and a cancel of one ends it at once. A job a
live process runs is never taken from it.

A dead owner here is a real process: started, its start time read, then killed."""

import os
import signal
import socket
import subprocess
import threading
from datetime import timedelta

import psutil
import pytest
from django.db import OperationalError, connection
from django.urls import reverse
from django.utils import timezone

from apps.buffer.models import BufferJob
from apps.core import job_owners, jobs
from apps.core.models import JobOwner
from apps.runs import duties
from apps.runs.models import Worker
from apps.tasksets import services as taskset_services
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task, Taskset, TasksetImport
from tests.apps.core.conftest import ROWS, jsonl_upload
from tests.support import on_another_connection, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
LABEL = "tasksets.tasksetimport"


@pytest.fixture
def process():
    """process(): a live process of this machine (killed after the test)."""
    started = []

    def start():
        proc = subprocess.Popen(["sleep", "600"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def owned_by(job, proc, *, started=None, host=None, worker="", since=None):
    """Record `proc` (a Popen) as the job's owner, as run_job's claim does in that process."""
    JobOwner.objects.update_or_create(job_label=jobs.label(job), job_id=job.pk, defaults={
        "host": host or socket.gethostname(), "pid": proc.pid, "pid_namespace": job_owners.pid_namespace(),
        "worker": worker, "since": since or timezone.now(),
        "process_started": started if started is not None else psutil.Process(proc.pid).create_time(),
    })


def killed(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc


@pytest.fixture
def half_import(researcher, process):
    """half_import(alive=False): an import of 30 rows whose process wrote 2 of them into its hidden
    taskset, then was killed (or, alive, still runs it)."""

    def make(alive=False):
        job = TasksetImport(original_filename="questions.jsonl", name="uploaded", format="jsonl",
                            field_mapping=FieldMapping("q", "a").to_dict(), created_by=researcher,
                            default_workflow=taskset_services.DEFAULT_WORKFLOW,
                            default_reward_fn=taskset_services.DEFAULT_REWARD_FN)
        job.upload.save("questions.jsonl", jsonl_upload(ROWS), save=False)
        job.bytes_total = job.upload.size
        job.save()  # not queued: its process is the one below
        hidden = Taskset.all_objects.create(name="uploaded", ready=False)
        Task.objects.bulk_create([Task(taskset=hidden, index=i, prompt=f"q{i}", answer=str(i)) for i in range(2)])
        TasksetImport.objects.filter(pk=job.pk).update(
            status="running", started_at=timezone.now(), taskset=hidden, rows_done=2, bytes_done=40)
        proc = process()
        owned_by(job, proc)
        if not alive:
            killed(proc)
        return TasksetImport.objects.get(pk=job.pk), hidden

    return make


def test_embedded_a_job_whose_server_was_killed_runs_again_from_the_start(half_import, settings):
    settings.RFTWEB_EMBEDDED = True
    job, hidden = half_import()
    assert taskset_services.name_taken("uploaded") == (
        f"a taskset named 'uploaded' is being imported (taskset import {job.pk}, which its page can cancel)")

    assert jobs.rerun_orphaned() == [f"{LABEL} {job.pk}"]

    wait_for(lambda: TasksetImport.objects.get(pk=job.pk).is_finished, timeout=30, what="the import run again")
    job.refresh_from_db()
    assert (job.status, job.error, job.rows_done) == ("succeeded", "", 30)
    assert not Taskset.all_objects.filter(pk=hidden.pk).exists(), "the killed attempt's hidden taskset went"
    assert list(Taskset.all_objects.filter(name="uploaded").values_list("ready", "task_count")) == [(True, 30)]
    assert job_owners.owner_of(LABEL, job.pk) is None, "ended: nobody runs it"
    assert jobs.rerun_orphaned() == [], "a finished job is not run again"


def test_a_job_a_live_process_runs_is_left_to_it(half_import, settings, client, researcher):
    settings.RFTWEB_EMBEDDED = True
    job, hidden = half_import(alive=True)  # another server, or a command, on the same database

    assert jobs.rerun_orphaned() == []
    client.force_login(researcher)
    shown = client.get(reverse("job-progress", args=[LABEL, job.pk])).json()
    assert (shown["status_text"], shown["rows_done"]) == ("running", 2)

    job = jobs.cancel_job(job)
    assert job.status == "running" and job.cancel_requested_at is not None, "asked to stop at its next batch"
    assert Taskset.all_objects.filter(pk=hidden.pk).exists(), "its process deletes it when it stops"


def test_a_pid_the_system_gave_to_another_process_is_not_the_owner(half_import, process):
    job, _ = half_import(alive=True)
    owner = job_owners.owner_of(LABEL, job.pk)
    assert not job_owners.is_gone(owner)
    owner.process_started -= 3600  # the owner started an hour before the process that has its pid now
    assert job_owners.is_gone(owner)


def test_a_process_of_another_pid_namespace_under_this_host_name_is_judged_by_its_worker(half_import):
    """A container with docker's network_mode: host (a Kubernetes hostNetwork pod; another machine
    also named `ubuntu`) has this host name and pids of its own: a pid of this namespace tells
    nothing of it (it would call a live import's process gone, and a Cancel would delete its data)."""
    job, _ = half_import()  # its process killed here
    owner = job_owners.owner_of(LABEL, job.pk)
    assert owner.pid_namespace == job_owners.pid_namespace() != "" and job_owners.is_gone(owner)

    owner.pid_namespace = "0798d727-e536-4f23-b44e-000000000000/pid:[4026532501]"  # a container's
    assert not job_owners.is_gone(owner), "an embedded server there: cannot tell, so left alone"
    now = timezone.now()
    owner.worker, owner.since = "jobs@container", now - timedelta(minutes=5)
    worker = Worker.objects.create(name="jobs@container", host=owner.host, pid=owner.pid,
                                   started_at=now - timedelta(hours=1), last_seen=now)
    assert not job_owners.is_gone(owner), "its worker beats"
    worker.started_at = now
    worker.save()
    assert job_owners.is_gone(owner), "restarted since the job started"


def test_an_owner_of_this_machines_earlier_boot_is_gone_and_one_recorded_before_namespaces_is_judged_by_pid(
    half_import, process
):
    """After a reboot (the laptop closed) the namespace names another boot id: an embedded demo's
    or an import command's job, which has no Celery worker to ask, was taken as running for good
    (its Cancel a request nobody read, its name held). Rows from before namespaces were recorded
    ("") were judged the same way, though the pid here is theirs."""
    machine, boot, pids = job_owners.pid_namespace().split("/")
    assert machine, "this machine has a machine id (/etc/machine-id)"
    job, _ = half_import(alive=True)
    owner = job_owners.owner_of(LABEL, job.pk)
    owner.pid_namespace = f"{machine}/00000000-0000-4000-8000-000000000000/{pids}"  # this machine, before its reboot
    assert job_owners.is_gone(owner), "every process of an earlier boot is gone"
    owner.pid_namespace = f"0798d727e5364f23b44e000000000000/00000000-0000-4000-8000-000000000000/{pids}"
    assert not job_owners.is_gone(owner), "another machine of this host name: cannot tell, left alone"
    owner.pid_namespace = ""  # recorded before core 0002
    assert not job_owners.is_gone(owner), "its pid is alive here"
    killed(psutil.Process(owner.pid))
    assert job_owners.is_gone(owner)
    host = socket.gethostname()
    assert duties.process_is_gone(f"{host}:{os.getpid()}", f"{machine}/00000000-0000-4000-8000-000000000000/{pids}")


def test_an_owner_recorded_before_the_machine_id_was_in_its_namespace_is_judged_by_pid(half_import):
    """core 0002's rows say "<boot id>/pid:[n]": matching neither this namespace nor "", an owner
    killed before the upgrade (an embedded demo's, a command's: no worker to ask) was taken as
    running for good."""
    _, boot, pids = job_owners.pid_namespace().split("/")
    job, _ = half_import(alive=True)
    owner = job_owners.owner_of(LABEL, job.pk)
    owner.pid_namespace = f"{boot}/{pids}"
    assert not job_owners.is_gone(owner), "its pid is alive here"
    killed(psutil.Process(owner.pid))
    assert job_owners.is_gone(owner)
    owner.pid_namespace = f"00000000-0000-4000-8000-000000000000/{pids}"  # another boot, or a machine of this name
    assert not job_owners.is_gone(owner), "cannot tell: left alone, as before"


def test_a_cancel_of_a_job_nobody_runs_ends_it_and_frees_its_name(half_import, client, researcher):
    """The full stack's case too: a Celery worker killed whole leaves its task unacknowledged until
    the broker's visibility timeout (6 h), and the job running meanwhile."""
    job, hidden = half_import()
    dead = job_owners.owner_of(LABEL, job.pk)
    client.force_login(researcher)
    progress_url = reverse("job-progress", args=[LABEL, job.pk])
    shown = client.get(progress_url).json()
    assert shown["status_text"] == (
        f"running, but the process that ran it (process {dead.pid} on {dead.host}) had stopped: it starts again "
        "if Celery redelivers its task, or Cancel ends it now")
    assert (shown["cancellable"], shown["cancel_requested"]) == (True, False)

    answer = client.post(reverse("taskset-import-cancel", args=[job.pk]), follow=True)

    assert "cancelled: no taskset" in answer.content.decode()  # (the names isolated: apps.core.bidi)
    job.refresh_from_db()
    assert job.status == "cancelled" and job.finished_at is not None and job.taskset is None
    assert job.error == f"cancelled after 2 rows: the process that ran it ({dead}) had stopped"
    assert not Taskset.all_objects.filter(pk=hidden.pk).exists() and not Task.objects.exists()
    assert taskset_services.name_taken("uploaded") is None, "the name is free to upload again"
    assert client.get(progress_url).json()["status_text"] == "cancelled"


def test_a_job_cancelled_before_its_server_died_is_ended_when_cancelled_again(half_import, settings):
    """Its page offers Cancel again: the first request waited for a safe point nobody reached."""
    job, hidden = half_import()
    TasksetImport.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())

    job = jobs.cancel_job(job)

    assert job.status == "cancelled" and not Taskset.all_objects.filter(pk=hidden.pk).exists()


def test_a_cancel_that_could_not_end_a_job_nobody_runs_leaves_it_to_the_next(half_import, monkeypatch):
    """The cancel takes the job (its owner: the cancelling process), then ends it outside the row
    lock, where an embedded SQLite busy with another writer may refuse the write: the job stays
    orphaned, so a second Cancel, or the watchdog, ends it."""
    job, hidden = half_import()
    finish = jobs._finish

    def database_busy(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(jobs, "_finish", database_busy)
    with pytest.raises(jobs.JobError, match="the database is busy"):
        jobs.cancel_job(job)

    assert job_owners.owner_of(LABEL, job.pk) is None
    assert jobs.orphaned(TasksetImport.objects.get(pk=job.pk)) == "no process ran it any more"
    monkeypatch.setattr(jobs, "_finish", finish)
    job = jobs.cancel_job(job)
    assert job.status == "cancelled" and not Taskset.all_objects.filter(pk=hidden.pk).exists()


def test_embedded_a_job_cancelled_before_its_server_died_is_ended_by_the_watchdog(half_import, settings):
    settings.RFTWEB_EMBEDDED = True
    job, hidden = half_import()
    dead = job_owners.owner_of(LABEL, job.pk)
    TasksetImport.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    job.refresh_from_db()
    assert jobs.snapshot(job, jobs.orphaned(job))["status_text"] == (
        f"running, but the process that ran it ({dead}) had stopped: the demo server ends it, cancelled (at its "
        f"start, then every {settings.RFTWEB_WATCHDOG_INTERVAL:g} s), or Cancel ends it now")

    assert jobs.rerun_orphaned() == [], "not run again"

    job.refresh_from_db()
    assert job.status == "cancelled"
    assert job.error == f"cancelled after 2 rows: the process that ran it ({dead}) had stopped"
    assert not Taskset.all_objects.filter(pk=hidden.pk).exists()


def test_embedded_a_job_a_cancel_takes_is_not_run_again_beside_it(half_import, settings, monkeypatch):
    """The watchdog found the job's process gone; a Cancel then took the job and was ending it (its
    hook deleting the hidden taskset, outside the row lock) when the watchdog put it back to
    pending: that found the cancel, and left the job to it (it had started the import again)."""
    settings.RFTWEB_EMBEDDED = True
    job, hidden = half_import()
    is_gone, finish, reads, ends = job_owners.is_gone, jobs._finish, [], []

    def gone_then_cancelled(owner):
        reads.append(owner)
        gone = is_gone(owner)
        if len(reads) == 1:  # the watchdog's read (the Cancel reads the owner again)
            on_another_connection(lambda: jobs.cancel_job(TasksetImport.objects.get(pk=job.pk)))
        return gone

    monkeypatch.setattr(job_owners, "is_gone", gone_then_cancelled)
    monkeypatch.setattr(jobs, "_finish", lambda *args, **kwargs: ends.append((args, kwargs)))  # still under way

    assert jobs.rerun_orphaned() == []

    (args, kwargs), = ends
    finish(*args, **kwargs)
    job.refresh_from_db()
    assert job.status == "cancelled" and not Taskset.all_objects.filter(pk=hidden.pk).exists()


def test_embedded_a_pending_job_nobody_claimed_runs(researcher, start_taskset_import, settings):
    """A command that sends nothing (rftweb.celery.serve_here(False)) or a server killed between the
    job's commit and its thread's claim left it pending."""
    job = start_taskset_import(researcher)  # (the test settings' broker: queued, never delivered)
    settings.RFTWEB_EMBEDDED = True
    assert jobs.rerun_orphaned() == [], "just made: its own thread's to claim"

    made = timezone.now() - timedelta(seconds=settings.RFTWEB_WATCHDOG_INTERVAL + 1)
    TasksetImport.objects.filter(pk=job.pk).update(created_at=made)  # a whole watchdog round unclaimed
    assert jobs.rerun_orphaned() == [f"{LABEL} {job.pk}"]

    wait_for(lambda: TasksetImport.objects.get(pk=job.pk).is_finished, timeout=30, what="the import")
    assert TasksetImport.objects.get(pk=job.pk).status == "succeeded"


def test_a_second_thread_sent_for_a_job_leaves_it_to_the_first(curator, settings, monkeypatch, process):
    """Embedded only a pending job is claimed: a rerun_orphaned beside the job's own thread never
    runs it twice. On the full stack a redelivered task runs a killed worker's job again, and
    leaves one a live process runs to it."""
    settings.RFTWEB_EMBEDDED = True
    runs = []
    monkeypatch.setitem(jobs.JOB_TYPES, "buffer.promote", lambda job, progress: runs.append(job.pk) or {})
    job = BufferJob.objects.create(kind=BufferJob.Kind.PROMOTE, status="running")
    job_owners.record("buffer.bufferjob", job.pk)  # this process runs it

    assert jobs.run_job("buffer.bufferjob", job.pk).status == "running" and runs == []
    settings.RFTWEB_EMBEDDED = False
    assert jobs.run_job("buffer.bufferjob", job.pk).status == "running" and runs == []
    worker = process()
    owned_by(job, worker)
    killed(worker)  # the worker that ran it was killed: the redelivery runs it again
    assert jobs.run_job("buffer.bufferjob", job.pk).status == "succeeded" and runs == [job.pk]


@pytest.mark.django_db(transaction=True)
def test_full_stack_a_job_delivered_again_while_it_runs_is_left_to_its_run(settings, monkeypatch, caplog):
    """Redis redelivers a task still unacknowledged after the visibility timeout (6 h) while its
    worker runs it: the second delivery claimed the running job and ran it again beside the first."""
    settings.RFTWEB_EMBEDDED = False
    runs, second = [], []

    def promote(job, progress):
        runs.append(job.pk)
        if len(runs) == 1:  # the broker delivers the task again meanwhile, to another worker's thread
            thread = threading.Thread(target=redelivered, args=(job.pk,))
            thread.start()
            thread.join()
        return {"promoted": 0}

    def redelivered(pk):
        try:
            second.append(jobs.run_job("buffer.bufferjob", pk).status)
        finally:
            connection.close()

    monkeypatch.setitem(jobs.JOB_TYPES, "buffer.promote", promote)
    job = BufferJob.objects.create(kind=BufferJob.Kind.PROMOTE)

    assert jobs.run_job("buffer.bufferjob", job.pk).status == "succeeded"
    assert runs == [job.pk] and second == ["running"]
    assert f"buffer.bufferjob {job.pk} was delivered again while" in caplog.text


def test_on_another_machine_its_celery_worker_tells_whether_the_owner_lives(half_import, process):
    job, _ = half_import(alive=True)
    now = timezone.now()
    owner = job_owners.owner_of(LABEL, job.pk)
    owner.host, owner.worker, owner.since = "gpu-7", "jobs@gpu-7", now - timedelta(minutes=5)
    worker = Worker.objects.create(name="jobs@gpu-7", host="gpu-7", pid=4242, started_at=now - timedelta(hours=1),
                                   last_seen=now)
    assert not job_owners.is_gone(owner), "its worker beats"

    worker.last_seen = now - timedelta(hours=1)
    worker.save()
    assert job_owners.is_gone(owner), "lost: silent past RFTWEB_HEARTBEAT_TIMEOUT"

    worker.started_at = worker.last_seen = now
    worker.save()
    assert job_owners.is_gone(owner), "restarted since the job started: the worker's new life does not run it"

    owner.worker = ""
    assert not job_owners.is_gone(owner), "an embedded server of another machine: cannot tell, so left alone"


def test_full_stack_a_task_delivered_again_soon_after_its_claim_on_another_machine_runs_its_job(half_import, settings):
    """A pool process that dies (out of memory) has its task redelivered at once
    (task_reject_on_worker_lost), perhaps to another machine, where its worker's beat said the
    owner lived: the job was left to a dead process for good. Only a delivery later than the
    broker's visibility timeout can be of a task a live process still runs."""
    settings.RFTWEB_EMBEDDED = False
    job, _ = half_import()
    now = timezone.now()
    Worker.objects.create(name="jobs@gpu-7", host="gpu-7", pid=4242, started_at=now - timedelta(hours=8),
                          last_seen=now)
    JobOwner.objects.filter(job_label=LABEL, job_id=job.pk).update(
        host="gpu-7", worker="jobs@gpu-7", since=now - timedelta(hours=7))
    assert jobs.run_job(LABEL, job.pk).status == "running", "past the visibility timeout: left to its worker"

    JobOwner.objects.filter(job_label=LABEL, job_id=job.pk).update(since=now - timedelta(minutes=5))
    job = jobs.run_job(LABEL, job.pk)

    assert (job.status, job.rows_done) == ("succeeded", 30)
    assert not job_owners.is_gone(JobOwner(host="gpu-7", worker="jobs@gpu-7", since=now - timedelta(minutes=5))), (
        "asked by a Cancel or the watchdog, not a delivery: its worker tells, as before")


def busy_finishes(monkeypatch, times: int) -> list[str]:
    """The first `times` ends of a job fail as a write to a database that stays busy fails (SQLite:
    "database is locked" after its 30 s timeout); returns the statuses each tried to save."""
    real, tried = jobs._finish, []

    def finish(job, status, **kwargs):
        tried.append(status)
        if len(tried) <= times:
            raise OperationalError("database is locked")
        real(job, status, **kwargs)

    monkeypatch.setattr(jobs, "_finish", finish)
    monkeypatch.setattr(jobs, "FINISH_RETRY_S", (0.0, 0.0, 0.0))
    return tried


def test_a_job_whose_end_finds_the_database_busy_tries_again(researcher, start_taskset_import, monkeypatch):
    monkeypatch.setattr(jobs, "enqueue", lambda *args, **kwargs: None)
    job = start_taskset_import(researcher)
    tried = busy_finishes(monkeypatch, times=2)

    job = jobs.run_job(LABEL, job.pk)

    assert tried == ["succeeded"] * 3
    job.refresh_from_db()
    assert (job.status, job.rows_done, job.taskset.task_count) == ("succeeded", 30, 30)
    assert job_owners.owner_of(LABEL, job.pk) is None


def test_embedded_a_job_whose_end_could_not_be_saved_is_let_go_and_run_again_without_importing_twice(
    researcher, start_taskset_import, monkeypatch, settings
):
    """It stayed `running` for good: its owner, this live server, was taken to run it, so neither the
    watchdog nor a Cancel ever ended it. Run again, the import finds its taskset shown and ends."""
    monkeypatch.setattr(jobs, "enqueue", lambda *args, **kwargs: None)
    job = start_taskset_import(researcher)
    busy_finishes(monkeypatch, times=4)  # every try of this run

    with pytest.raises(OperationalError):
        jobs.run_job(LABEL, job.pk)

    job.refresh_from_db()
    assert job.status == "running" and job_owners.owner_of(LABEL, job.pk) is None
    assert jobs.orphaned(job) == "no process ran it any more"
    settings.RFTWEB_EMBEDDED = True
    assert jobs.rerun_orphaned() == [f"{LABEL} {job.pk}"]
    job = jobs.run_job(LABEL, job.pk)  # what the watchdog's thread does

    assert (job.status, job.error, job.rows_total) == ("succeeded", "", 30)
    assert list(Taskset.all_objects.values_list("name", "ready", "task_count")) == [("uploaded", True, 30)]
