"""Celery entry points into run supervision (apps/runs/supervision.py: duties, heartbeats, the
engine, failures, the watchdog), into buffer retention's daily sweep (apps/buffer/retention.py),
the buffer's search indexer (apps/buffer/search.py) and alerts (apps/alerts/services.py).
Their names are what beat schedules, routes (settings.CELERY_TASK_ROUTES) and queued messages
hold. `serve_duty` serves one *duty* of a run ("loop", "explorer" or "trainer"). A worker registers
itself when it is ready and beats while it lives (apps/runs/capacity.py: the Workers page).
"""
from billiard.exceptions import WorkerLostError
from celery import shared_task
from celery.signals import task_failure, task_postrun, task_prerun, worker_ready, worker_shutdown, worker_shutting_down
from django.conf import settings

from apps.alerts import services as alerts
from apps.buffer import retention, search
from apps.runs import capacity, supervision, task_log


@shared_task(name="workers.tasks.start_run")
def start_run(run_id: int) -> None:
    supervision.start_run(run_id)


# No result stored: nobody reads it, and a stopped run's queued tasks (hundreds) exit faster.
# Not rejected (requeued) when its pool process dies: Celery handed an out-of-memory launch's task
# to the next pool process 7 times in 58 s. _serve_duty_lost decides instead (once, then the run fails).
@shared_task(name="workers.tasks.serve_duty", bind=True, acks_late=True, reject_on_worker_lost=False,
             ignore_result=True)
def serve_duty(self, run_id: int, duty: str = "loop") -> str:
    return supervision.serve(run_id, duty, task=self.request.id)


@task_failure.connect
def _serve_duty_lost(sender, task_id, exception, args, kwargs, **_):  # in the worker's main process
    if isinstance(exception, WorkerLostError):
        task_log.ended(task_id, "lost", exception)
        if getattr(sender, "name", None) == serve_duty.name:
            supervision.worker_lost(task_id, *args, cause=str(exception), **kwargs)


@task_prerun.connect
def _task_started(sender, task_id, args, **_):  # in the process that runs it (the Workers page's task list)
    task_log.started(task_id, getattr(sender, "name", "?"), args)


@task_postrun.connect
def _task_ended(sender, task_id, retval, state, **_):
    task_log.ended(task_id, state or "done", retval)


@shared_task(name="workers.tasks.watchdog")
def watchdog() -> list[tuple[int, str]]:
    return supervision.watchdog()


@shared_task(name="workers.tasks.buffer_retention")
def buffer_retention() -> int | None:  # the id of the job it queued
    return getattr(retention.sweep(), "pk", None)


@shared_task(name="workers.tasks.index_search")
def index_search() -> int:  # the backlog left: rows written that no search finds yet
    return search.catch_up(seconds=settings.RFTWEB_SEARCH_INDEX_INTERVAL)


@shared_task(name="workers.tasks.deliver_alert")
def deliver_alert(alert_id: int) -> str:
    return alerts.deliver(alert_id)


@shared_task(name="workers.tasks.alerts")
def alerts_beat() -> None:  # stalled runs, and the alerts whose send is due again
    alerts.beat()


@worker_ready.connect
def _worker_ready(sender, **_):  # sender: the worker's consumer
    capacity.worker_ready(sender.controller)


@worker_shutting_down.connect
def _worker_shutting_down(sender, **_):  # sender: the worker's hostname; a SIGTERM or SIGINT
    capacity.worker_stopping(sender)


@worker_shutdown.connect
def _worker_shutdown(sender, **_):  # sender: the worker
    capacity.worker_stopping(sender.hostname)
