"""Who runs a job, and whether that process is still there (apps.core.models.JobOwner).

A job's process can die without ending it: an embedded server killed mid-import (kill -9, Ctrl-C
twice, a laptop closed) takes the job's thread with it, and a Celery worker killed whole leaves its
task unacknowledged until the broker's visibility timeout (6 h). The job then says `running` for
good. Its owner, recorded when it claimed the job, tells whether anyone still runs it:

- in this process's pid namespace, exactly: the owner's pid is alive and started when the owner
  did. The host name alone does not tell that namespace: a container with docker's
  `network_mode: host` or a Kubernetes pod with hostNetwork has the machine's host name and pids
  of its own, and two machines may both be named `ubuntu`; a pid checked there would call a live
  import's process gone, and a Cancel would then delete what it imports;
- elsewhere (another machine, or another pid namespace), by its Celery worker (the Workers page's
  registry, apps.runs.capacity): the same life of that worker (not restarted since the job
  started) still beating within RFTWEB_HEARTBEAT_TIMEOUT. An owner with no worker there (an
  embedded server of another machine on a shared Postgres) cannot be judged, and is taken as
  alive: a job is never taken from a process that may still run it.
"""

import socket
from datetime import timedelta

import psutil
from django.conf import settings
from django.utils import timezone

from apps.runs import capacity
from apps.runs.duties import earlier_boot, pid_namespace, same_namespace
from apps.runs.models import Worker

from .models import JobOwner

# /proc/stat's boot time, which psutil adds to a process's start in ticks, moves with NTP
# adjustments by up to a second between two reads: a start that close is the same process.
SAME_START_S = 1.0


def record(job_label: str, job_id: int) -> None:
    """This process runs the job from now on, for the Celery worker serving the current task (the
    name duty heartbeats give it: capacity.this_node). Called in the transaction that claims it."""
    me = psutil.Process()
    JobOwner.objects.update_or_create(job_label=job_label, job_id=job_id, defaults={
        "host": socket.gethostname(), "pid": me.pid, "process_started": me.create_time(),
        "pid_namespace": pid_namespace(), "worker": capacity.this_node() or "", "since": timezone.now(),
    })


def release(job_label: str, job_id: int) -> None:
    """The job has ended: nobody runs it (a finished job is never run again)."""
    JobOwner.objects.filter(job_label=job_label, job_id=job_id).delete()


def owner_of(job_label: str, job_id: int) -> JobOwner | None:
    return JobOwner.objects.filter(job_label=job_label, job_id=job_id).first()


def is_gone(owner: JobOwner | None, *, redelivered: bool = False) -> bool:
    """Whether the process that ran a job has certainly exited. No owner: the job was never claimed
    by this version's runner (pending, or left running by an earlier version's), so nobody runs it.

    `redelivered`: asked by a delivery of the job's task (jobs.run_job). Elsewhere a beating Celery
    worker says its main process lives, not the pool process running the job: one that died (out of
    memory) has its task redelivered at once (task_reject_on_worker_lost), perhaps to another
    machine, which left the job to it for good. Redis redelivers a task a live process runs only
    after the visibility timeout; a delivery sooner than that after the claim is of a dead one."""
    if owner is None:
        return True
    if owner.host == socket.gethostname():
        # "": recorded before namespaces were (core 0002), judged by its pid as it was then.
        if owner.pid_namespace == "" or same_namespace(owner.pid_namespace):
            return not _alive_here(owner.pid, owner.process_started)
        if earlier_boot(owner.pid_namespace):
            return True
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    if redelivered and timezone.now() - owner.since < timedelta(seconds=visibility):
        return True
    if not owner.worker:
        return False
    worker = Worker.objects.filter(name=owner.worker).first()
    if worker is None:
        return False
    silent = timezone.now() - worker.last_seen > timedelta(seconds=settings.RFTWEB_HEARTBEAT_TIMEOUT)
    return worker.started_at > owner.since or silent


def _alive_here(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        # A killed process whose parent has not reaped it (a container's PID 1 may never) is a zombie:
        # gone all the same.
        return abs(process.create_time() - started) < SAME_START_S and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:  # alive, another user's
        return True
