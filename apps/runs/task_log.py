"""The tasks each worker ran, with their runtime and outcome, for the Workers page (what Celery
Flower lists): a row at each task's start (Celery's task_prerun, in the process that runs it) and
its end (task_postrun; a pool process killed under its task: worker_lost, in the worker's main
process). Kept for KEPT_FOR and at most KEPT rows: the watchdog alone ticks 2,880 times a day."""
from datetime import timedelta

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection
from django.db.models import Count, Q
from django.utils import timezone

from . import capacity
from .models import TaskRun

KEPT_FOR = timedelta(days=1)
KEPT = 5000
PRUNE_EVERY = 100  # rows written between two prunes (a prune is two DELETEs)
SHOWN = 50  # the page's and the API's list: the newest
FAILED = ("failure", "lost", "revoked")  # Celery's states a task ends in without its result
_written = 0


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def started(task_id: str, name: str, args) -> None:
    global _written
    try:
        TaskRun.objects.update_or_create(task_id=task_id, defaults={
            "name": _cut(name, 100), "args": _cut(repr(list(args or ())), 200),
            "worker": capacity.this_node() or "", "started_at": timezone.now(), "runtime_s": None,
            "outcome": "running", "result": ""})
        _written += 1
        if _written % PRUNE_EVERY == 1:
            prune()
    except DatabaseError:  # a task runs whether or not its row could be written
        connection.close()


def serves(task_id: str, args) -> None:
    """A serve_duty task given another duty than the one it was sent for (turns.turn): its row
    names what it serves (the page listed the duty of the message, and a kill of it as another's)."""
    try:
        TaskRun.objects.filter(task_id=task_id).update(args=_cut(repr(list(args)), 200))
    except DatabaseError:
        connection.close()


def ended(task_id: str, outcome: str, result) -> None:
    try:
        row = TaskRun.objects.filter(task_id=task_id).first()
        if row is not None:
            row.runtime_s = (timezone.now() - row.started_at).total_seconds()
            row.outcome, row.result = outcome.lower(), _cut(str(result), 500)
            row.save(update_fields=["runtime_s", "outcome", "result"])
    except DatabaseError:
        connection.close()


def prune() -> None:
    TaskRun.objects.filter(started_at__lt=timezone.now() - KEPT_FOR).delete()
    newest = TaskRun.objects.order_by("-started_at").values_list("started_at", flat=True)[KEPT:KEPT + 1]
    if newest:
        TaskRun.objects.filter(started_at__lte=newest[0]).delete()


def periodic_tasks() -> list[str]:
    """The housekeeping Celery beat sends on a schedule (settings.CELERY_BEAT_SCHEDULE)."""
    return sorted({entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()})


def recent(limit: int = SHOWN) -> list[dict]:
    """The newest tasks but the periodic ones, as the Workers page and /api/workers/ show them:
    with them, 25 of a walkthrough's 50 rows after 13 minutes were the search index's round (every
    10 s) and 9 the watchdog's, and the runs' tasks had scrolled away."""
    return [_shown(t) for t in TaskRun.objects.exclude(name__in=periodic_tasks())[:limit]]


def housekeeping() -> list[dict]:
    """Each periodic task: its newest run (a row as `recent` shows it, or None) and its runs and
    failures in the rows kept, as Flower's and Celery beat's views sum them up."""
    names = periodic_tasks()
    counts = dict.fromkeys(names, (0, 0)) | {
        row["name"]: (row["runs"], row["failed"]) for row in TaskRun.objects.filter(name__in=names)
        .values("name").annotate(runs=Count("pk"), failed=Count("pk", filter=Q(outcome__in=FAILED)))}
    shown = []
    for name, (runs, failed) in counts.items():
        newest = TaskRun.objects.filter(name=name).first()
        shown.append({"name": name.rpartition(".")[2], "runs": runs, "failed": failed,
                      "newest": _shown(newest) if newest else None})
    return shown


def _shown(t: TaskRun) -> dict:
    return {"task_id": t.task_id, "name": t.name.rpartition(".")[2], "args": t.args, "worker": t.worker,
            "started_at": t.started_at.isoformat(), "runtime_s": t.runtime_s, "outcome": t.outcome,
            "result": t.result}
