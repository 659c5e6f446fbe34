"""Celery tasks: thin wrappers that load a run, build the engine over the Postgres stores and loop.

A run is served by one or two long tasks, each holding a *role* of the run:
- `loop` (queue `train`): explorer and trainer alternate in one process, as the headless engine
  runs them. Used with `synchronizer.method: memory` and for single-role modes.
- `explorer` (queue `explore`) + `trainer` (queue `train`): with `synchronizer.method: checkpoint`
  in mode `both`, the roles run in separate workers (and machines) and meet through the Postgres
  buffer and the versioned weights directory.
A role is held through a heartbeat written by a background thread; the `watchdog` (Celery beat)
re-enqueues a role whose heartbeat expired (its worker died), and the new task resumes: the
trainer from the last checkpoint, the explorer from its last stored step. Pause and stop are
statuses the roles check every step.
"""
import logging
import os
import socket
import threading
import time
import traceback

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, connection

from apps.runs import services
from apps.runs.live import publisher
from apps.runs.models import Run

log = logging.getLogger(__name__)
Status = Run.Status
ACTIVE = (Status.STARTING, Status.RUNNING, Status.PAUSED, Status.STOPPING)
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
                services.heartbeat(self.target_run, self.role, self.worker)
                if self.role != "explorer":  # one series per run
                    services.record_metrics(self.target_run, "system", int(time.time()), system_metrics())
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


def wait_while_paused(run: Run, interval: float = 1.0) -> str:
    run.refresh_from_db(fields=["status"])
    while run.status == Status.PAUSED:
        time.sleep(interval)
        run.refresh_from_db(fields=["status"])
    return run.status


@shared_task(name="workers.tasks.run_role", acks_late=True)
def run_role(run_id: int, role: str = "loop") -> str:
    # Imported here: torch loads only in workers, not in every web process that enqueues.
    from apps.runs.store import run_stores
    from workers.rft.config import RunConfig
    from workers.rft.loop import EXPLORER, TRAINER, Loop

    run = Run.objects.get(pk=run_id)
    me = worker_id()
    if run.status not in ACTIVE or not services.claim_role(run, role, me, settings.RFTWEB_HEARTBEAT_TIMEOUT):
        return "skipped"
    beat = Heartbeat(run, role, me, settings.RFTWEB_HEARTBEAT_INTERVAL)
    beat.start()
    try:
        config = RunConfig.from_dict(run.config)
        stores = run_stores(run, config)
        loop = Loop(config, stores, run_dir(run), roles={"explorer": (EXPLORER,), "trainer": (TRAINER,)}.get(role))
        if loop.trainer is not None:
            checkpoint = stores.checkpoints.latest()
            if checkpoint is not None:
                loop.resume(checkpoint.path)
            # Steps after the checkpoint are replayed: give them back the rows the dead worker took.
            stores.buffer.rewind(checkpoint.created_at if checkpoint else None)
        run.refresh_from_db()
        if role == "explorer":
            loop.explorer.step = run.explorer_step  # steps already stored are not redone
        services.mark_running(run)

        if role == "explorer":
            return loop.run_explorer(should_stop=lambda: wait_while_paused(run) != Status.RUNNING, wait=pause)
        stopping = lambda: wait_while_paused(run) in (Status.STOPPING, *Run.FINISHED)  # noqa: E731
        if role == "trainer":
            outcome = loop.run_trainer(stopping, explored_steps=lambda: explorer_steps(run), wait=pause)
        else:
            outcome = loop.run(should_stop=stopping)
        finish(run)
        return outcome
    except Exception:
        log.exception("run %s (%s) failed", run_id, role)
        close_old_connections()
        run = Run.objects.get(pk=run_id)
        if not run.is_finished:
            services.set_status(run, Status.FAILED, error=f"{role}: {traceback.format_exc(limit=8)}")
        return "failed"
    finally:
        beat.stop()
        publisher.flush()


def pause() -> None:
    time.sleep(WAIT_SECONDS)


def explorer_steps(run: Run) -> int:
    run.refresh_from_db(fields=["explorer_step"])
    return run.explorer_step


def finish(run: Run) -> None:
    """The trainer (or the single loop) is done: completed, or stopped if a stop was asked."""
    run.refresh_from_db(fields=["status"])
    if not run.is_finished:
        services.set_status(run, Status.STOPPED if run.status == Status.STOPPING else Status.COMPLETED)


@shared_task(name="workers.tasks.watchdog")
def watchdog() -> list[tuple[int, str]]:
    """Re-enqueue the roles whose worker stopped beating (killed, lost its machine)."""
    resumed = []
    for run in Run.objects.filter(status__in=ACTIVE):
        for role in roles_of_run(run):
            age = services.heartbeat_age(run, role)
            if age is None and run.status == Status.STARTING:
                continue  # queued for a worker that has not picked it up yet
            if age is None or age > settings.RFTWEB_HEARTBEAT_TIMEOUT:
                # Mark the role as handed over, so the next watchdog tick does not enqueue it again.
                services.heartbeat(run, role, services.HANDED_OVER)
                enqueue(run_role, run.pk, role, queue=QUEUE_OF_ROLE[role])
                resumed.append((run.pk, role))
    return resumed
