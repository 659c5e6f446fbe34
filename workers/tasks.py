"""Celery tasks: thin wrappers that load a run, build the engine over the Postgres stores and loop.

A run is served by one or two long tasks, each holding a *role* of the run:
- `loop` (queue `train`): explorer and trainer in one process, as the headless engine runs them
  (overlapping in two threads from offset 1). Used with `synchronizer.method: memory` and for
  single-role modes.
- `explorer` (queue `explore`) + `trainer` (queue `train`): with `synchronizer.method: checkpoint`
  in mode `both`, the roles run in separate workers (and machines) and meet through the Postgres
  buffer and the versioned weights directory.
A role is held through a heartbeat written by a background thread; the `watchdog` (Celery beat)
re-enqueues a role whose heartbeat expired (its worker died), and the new task resumes: the
trainer from the last checkpoint, the explorer from its last stored step. A failed or stopped
run resumes the same way when its user resumes it (services.resume_run queues it again). Pause
and stop are statuses the roles check every step; so is holding the role: a worker that finds
its role taken over stops at once, saving and changing nothing.
"""
import errno
import logging
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from apps.runs import services
from apps.runs.live import publisher
from apps.runs.models import Run

log = logging.getLogger(__name__)
Status = Run.Status
ACTIVE = Run.ACTIVE
QUEUE_OF_ROLE = {"loop": "train", "explorer": "explore", "trainer": "train"}
WAIT_SECONDS = 0.5  # how often a role waiting for the other one looks again


def enqueue(task, *args, queue: str = "default") -> None:
    """Send a task to its queue; embedded (no REDIS_URL) run it on a thread of this process, which
    is then the worker (its live updates reach this process's in-memory channel layer)."""
    if not settings.RFTWEB_EMBEDDED:
        task.apply_async(args, queue=queue)
        return

    def work():
        try:
            task(*args)
        finally:
            connection.close()

    threading.Thread(target=work, daemon=True, name=f"{task.name}{args}").start()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_dir(run: Run):
    """The run's work dir (weights versions, checkpoints). Named by id *and* creation time: ids are
    reused after a database reset, and a new run must never resume from an old run's files."""
    return settings.DATA_DIR / "runs" / f"{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def roles_of_run(run: Run) -> tuple[str, ...]:
    config = run.config
    split = config["mode"] == "both" and config["synchronizer"]["method"] == "checkpoint"
    return ("explorer", "trainer") if split else ("loop",)


@shared_task(name="workers.tasks.start_run")
def start_run(run_id: int) -> None:
    run = Run.objects.get(pk=run_id)
    if run.status != Status.QUEUED:
        return
    services.set_status(run, Status.STARTING)
    for role in roles_of_run(run):
        enqueue(run_role, run_id, role, queue=QUEUE_OF_ROLE[role])


class Heartbeat(threading.Thread):
    """Beats every `interval` seconds while the task lives, however long a step takes, and logs
    system metrics (CPU, memory, GPU) with each beat."""

    def __init__(self, run: Run, role: str, worker: str, interval: float):
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}-{role}")
        self.target_run, self.role, self.worker, self.interval = run, role, worker, interval
        self.stopped = threading.Event()

    def run(self):
        try:
            while not self.stopped.wait(self.interval):
                try:
                    if not services.heartbeat(self.target_run, self.role, self.worker):
                        return  # the role was taken over: the role's next status check stops it
                    if self.role != "explorer":  # one series per run
                        services.record_metrics(self.target_run, "system", int(time.time()), system_metrics())
                except DATABASE_LOST as err:  # beat again once the database is back
                    log.warning("heartbeat of run %s (%s) missed: %s", self.target_run.pk, self.role, err)
                    connection.close()
        finally:
            connection.close()

    def stop(self):
        self.stopped.set()
        self.join(timeout=5)


def system_metrics() -> dict:
    import psutil
    import torch

    values = {"cpu_percent": psutil.cpu_percent(), "memory_gb": psutil.Process().memory_info().rss / 2**30}
    if torch.cuda.is_available():
        values["gpu_memory_gb"] = torch.cuda.memory_allocated() / 2**30
    return values


class RoleLost(Exception):
    """Another worker holds this role now (the watchdog handed it on, or the run was resumed)."""


def wait_while_paused(run: Run, role: str, worker: str, interval: float = 1.0) -> str:
    """The run's status once it is not paused; RoleLost as soon as `worker` no longer holds `role`."""
    while True:
        run.refresh_from_db(fields=["status", "heartbeats"])
        if services.holder(run, role) != worker:
            raise RoleLost(f"run {run.pk}: worker {worker} no longer holds the {role} role")
        if run.status != Status.PAUSED:
            return run.status
        time.sleep(interval)


@shared_task(name="workers.tasks.run_role", acks_late=True)
def run_role(run_id: int, role: str = "loop") -> str:
    run = Run.objects.get(pk=run_id)
    me = worker_id()
    if not services.claim_role(run, role, me, settings.RFTWEB_HEARTBEAT_TIMEOUT):
        return "skipped"
    beat = Heartbeat(run, role, me, settings.RFTWEB_HEARTBEAT_INTERVAL)
    beat.start()
    failure = None
    try:
        while True:
            try:
                return serve_role(run, role, me)
            except DATABASE_LOST as err:
                # Postgres restarted or the network blipped: wait for it, then resume in place from
                # the last checkpoint, exactly as a replacement worker would.
                log.warning("run %s (%s) lost the database (%s); resuming once it is back", run_id, role, err)
                if not wait_for_database(settings.RFTWEB_DATABASE_OUTAGE_SECONDS):
                    return "lost the database"  # the watchdog hands the role on once it is back
    except RoleLost as lost:
        log.warning("%s; it stops here", lost)
        return "taken over"
    except Exception as exc:
        log.exception("run %s (%s) failed", run_id, role)
        close_old_connections()
        failure = describe_failure(role, exc, run_dir(run))
        return "failed"
    finally:
        beat.stop()
        try:  # let the role go (failing the run with the error, if any): it may be resumed at once
            services.release_role(run, role, me, error=failure)
        except DATABASE_LOST:
            log.warning("run %s (%s): the database is gone; the role's heartbeat expires instead", run_id, role)
        publisher.flush()


def serve_role(run: Run, role: str, worker: str) -> str:
    """Build the engine for the role from the run's last checkpoint and stored steps, and run it."""
    # Imported here: torch loads only in workers, not in every web process that enqueues.
    from apps.runs.store import run_stores
    from workers.rft.config import RunConfig
    from workers.rft.loop import EXPLORER, TRAINER, Loop

    config = RunConfig.from_dict(run.config)
    stores = run_stores(run, config)
    roles = {"explorer": (EXPLORER,), "trainer": (TRAINER,)}.get(role)
    status = lambda: wait_while_paused(run, role, worker)  # noqa: E731
    # Closed when the role ends: a worker process outlives its runs, vLLM's processes must not.
    with Loop(config, stores, run_dir(run), roles=roles) as loop:
        if loop.trainer is not None:
            checkpoint = stores.checkpoints.latest()
            if checkpoint is not None:
                log.info("run %s (%s): from checkpoint v%s (trainer step %s)", run.pk, role, checkpoint.version, checkpoint.step)
                loop.resume(checkpoint.path)
            elif run.trainer_step:
                log.info("run %s (%s): no checkpoint yet, from step 0 (same run)", run.pk, role)
            # Steps after the checkpoint are replayed: give them back the rows the lost steps took.
            stores.buffer.rewind(checkpoint.created_at if checkpoint else None)
        run.refresh_from_db()
        if role == "explorer":
            loop.explorer.step = run.explorer_step  # steps already stored are not redone
        status()  # nobody took the role over while the engine loaded
        services.mark_running(run)

        if role == "explorer":
            return loop.run_explorer(should_stop=lambda: status() != Status.RUNNING, wait=pause)
        stopping = lambda: status() in (Status.STOPPING, *Run.FINISHED)  # noqa: E731
        if role == "trainer":
            outcome = loop.run_trainer(stopping, explored_steps=lambda: explorer_steps(run), wait=pause)
        else:
            outcome = loop.run(should_stop=stopping)
    finish(run, status())
    return outcome


DATABASE_LOST = (OperationalError, InterfaceError)
DISK_FULL_MARKS = ("No space left on device", "StorageFull", "file write failed")
MAX_CAUSE_CHARS = 1000  # an exception can quote a whole input back


def wait_for_database(timeout: float) -> bool:
    """True once a new connection works, False after `timeout` seconds of trying."""
    deadline = time.monotonic() + timeout
    while True:
        connection.close()
        try:
            connection.ensure_connection()
            return True
        except DATABASE_LOST:
            if time.monotonic() > deadline:
                return False
            time.sleep(1)


def describe_failure(role: str, exc: BaseException, work_dir) -> str:
    """The run's error, as every researcher watching the run reads it: the cause and what to do.
    The traceback is not part of it (it names the server's files and code): run_role logs it in
    the worker's log. A full disk surfaces as OSError, torch's RuntimeError or safetensors' own
    error: look at the error's text and at the disk itself."""
    disk_full = getattr(exc, "errno", None) == errno.ENOSPC or any(mark in str(exc) for mark in DISK_FULL_MARKS)
    if disk_full or free_bytes(work_dir) < 1024 * 1024:
        return (
            f"{role} failed: the disk holding the run's directory ({without_server_paths(work_dir)} in the data "
            "directory) is full (no space left on device). Free space there, then resume the run: it continues "
            "from its last checkpoint."
        )
    cause = without_server_paths(f"{type(exc).__name__}: {exc}")
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[:MAX_CAUSE_CHARS] + " [...]"
    return (
        f"{role} failed: {cause}\n\nThe traceback is in the worker's log, for the server's administrators. "
        "Fix the cause, then resume the run: it continues from its last checkpoint."
    )


def without_server_paths(text) -> str:
    """Paths in the data directory as the user knows them (relative to it); the server's own
    directories (the code, Python's install) not at all."""
    text = str(text)
    for directory, shown_as in (
        (settings.DATA_DIR, ""),
        (settings.BASE_DIR, "<rftweb>/"),
        (Path(sys.prefix), "<python>/"),
        (Path(sys.base_prefix), "<python>/"),
    ):
        text = text.replace(f"{directory}{os.sep}", shown_as).replace(str(directory), shown_as or ".")
    return text


def free_bytes(path) -> float:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return float("inf")


def pause() -> None:
    time.sleep(WAIT_SECONDS)


def explorer_steps(run: Run) -> int:
    run.refresh_from_db(fields=["explorer_step"])
    return run.explorer_step


def finish(run: Run, status: str) -> None:
    """The trainer (or the single loop) is done: completed, or stopped if a stop was asked."""
    if status not in Run.FINISHED:
        services.set_status(run, Status.STOPPED if status == Status.STOPPING else Status.COMPLETED)


@shared_task(name="workers.tasks.watchdog")
def watchdog() -> list[tuple[int, str]]:
    """Re-enqueue the roles of active runs that no worker holds (their worker was killed, lost its
    machine or quit), up to RFTWEB_MAX_HANDOVERS times in a row without progress; then the run
    fails. A stopping run that no worker holds any more is stopped: nobody is left to stop it.
    Failed runs are left alone: resuming one is its user's call."""
    timeout = settings.RFTWEB_HEARTBEAT_TIMEOUT
    resumed = []
    for run in Run.objects.filter(status__in=ACTIVE):
        if run.status == Status.STOPPING:
            if not services.workers_holding(run):
                services.set_status(run, Status.STOPPED)
            continue
        for role in roles_of_run(run):
            if role not in run.heartbeats and run.status == Status.STARTING:
                continue  # queued for a worker that has not picked it up yet
            # Held by HANDED_OVER until a worker claims it: the next tick does not enqueue it again.
            if services.holder(run, role, timeout) is None:
                if not services.hand_over(run, role, settings.RFTWEB_MAX_HANDOVERS):
                    break  # the run failed: its user resumes it
                enqueue(run_role, run.pk, role, queue=QUEUE_OF_ROLE[role])
                resumed.append((run.pk, role))
    return resumed
