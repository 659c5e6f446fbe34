"""Celery tasks: thin wrappers that load a run, build the engine over the Postgres stores and loop.

A run's work is one long task on queue `train` (`run_loop`): the engine's Loop runs explorer and
trainer in that process. It holds the run's `loop` role through a heartbeat written by a
background thread; the `watchdog` (Celery beat) re-enqueues a run whose heartbeat expired (its
worker died) and the new task resumes from the last checkpoint. Pause and stop are statuses the
loop checks after every trainer step.
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
ROLE = "loop"
ACTIVE = (Status.STARTING, Status.RUNNING, Status.PAUSED, Status.STOPPING)


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


def run_dir(run_id: int):
    return settings.DATA_DIR / "runs" / str(run_id)


@shared_task(name="workers.tasks.start_run")
def start_run(run_id: int) -> None:
    run = Run.objects.get(pk=run_id)
    if run.status != Status.QUEUED:
        return
    services.set_status(run, Status.STARTING)
    enqueue(run_loop, run_id, queue="train")


class Heartbeat(threading.Thread):
    """Beats every `interval` seconds while the task lives, however long a step takes, and logs
    system metrics (CPU, memory, GPU) with each beat."""

    def __init__(self, run: Run, worker: str, interval: float):
        super().__init__(daemon=True, name=f"heartbeat-run-{run.pk}")
        self.target_run, self.worker, self.interval = run, worker, interval
        self.stopped = threading.Event()

    def run(self):
        try:
            while not self.stopped.wait(self.interval):
                services.heartbeat(self.target_run, ROLE, self.worker)
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


@shared_task(name="workers.tasks.run_loop", acks_late=True)
def run_loop(run_id: int) -> str:
    # Imported here: torch loads only in workers, not in every web process that enqueues.
    from apps.runs.store import run_stores
    from workers.rft.config import RunConfig
    from workers.rft.loop import Loop

    run = Run.objects.get(pk=run_id)
    me = worker_id()
    if run.status not in ACTIVE or not services.claim_role(run, ROLE, me, settings.RFTWEB_HEARTBEAT_TIMEOUT):
        return "skipped"
    beat = Heartbeat(run, me, settings.RFTWEB_HEARTBEAT_INTERVAL)
    beat.start()
    try:
        config = RunConfig.from_dict(run.config)
        stores = run_stores(run, config)
        loop = Loop(config, stores, run_dir(run_id))
        checkpoint = stores.checkpoints.latest()
        if checkpoint is not None:
            loop.resume(checkpoint.path)
        # Steps after the checkpoint are replayed: give them back the rows the dead worker took.
        stores.buffer.rewind(checkpoint.created_at if checkpoint else None)
        run.refresh_from_db(fields=["status"])
        if run.status == Status.STARTING:
            services.set_status(run, Status.RUNNING)
        outcome = loop.run(should_stop=lambda: wait_while_paused(run) == Status.STOPPING)
        run.refresh_from_db(fields=["status"])
        services.set_status(run, Status.STOPPED if run.status == Status.STOPPING else Status.COMPLETED)
        return outcome
    except Exception:
        log.exception("run %s failed", run_id)
        close_old_connections()
        run = Run.objects.get(pk=run_id)
        if not run.is_finished:
            services.set_status(run, Status.FAILED, error=traceback.format_exc(limit=8))
        return "failed"
    finally:
        beat.stop()
        publisher.flush()


@shared_task(name="workers.tasks.watchdog")
def watchdog() -> list[int]:
    """Re-enqueue the runs whose worker stopped beating (killed, lost its machine)."""
    resumed = []
    for run in Run.objects.filter(status__in=ACTIVE):
        age = services.heartbeat_age(run, ROLE)
        if age is None and run.status == Status.STARTING:
            continue  # queued for a worker that has not picked it up yet
        if age is None or age > settings.RFTWEB_HEARTBEAT_TIMEOUT:
            # Mark the role as handed over, so the next watchdog tick does not enqueue it again.
            services.heartbeat(run, ROLE, services.HANDED_OVER)
            enqueue(run_loop, run.pk, queue="train")
            resumed.append(run.pk)
    return resumed
