"""State changes of runs. Views, commands and workers call these, never the models directly."""
from django.db import transaction
from django.utils import timezone

from .live import publisher
from .models import MetricPoint, Run

Status = Run.Status

# Which status may follow which. Anything else is refused with InvalidTransition.
TRANSITIONS: dict[str, set[str]] = {
    Status.QUEUED: {Status.STARTING, Status.STOPPED, Status.FAILED},
    Status.STARTING: {Status.RUNNING, Status.STOPPING, Status.FAILED},
    Status.RUNNING: {Status.PAUSED, Status.STOPPING, Status.COMPLETED, Status.FAILED},
    Status.PAUSED: {Status.RUNNING, Status.STOPPING, Status.FAILED},
    Status.STOPPING: {Status.STOPPED, Status.FAILED},
    Status.STOPPED: set(),
    Status.COMPLETED: set(),
    Status.FAILED: set(),
}


class InvalidTransition(Exception):
    pass


def broadcast(run_id: int, update: dict) -> None:
    """Publish to the run's live channel once the current transaction commits (never a rolled-back change)."""
    transaction.on_commit(lambda: publisher.publish(run_id, update))


@transaction.atomic
def set_status(run: Run, new_status: str, *, error: str = "") -> Run:
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if new_status not in TRANSITIONS[locked.status]:
        raise InvalidTransition(f"run {locked.pk} cannot go from {locked.status} to {new_status}")
    locked.status = new_status
    now = timezone.now()
    if new_status == Status.RUNNING and locked.started_at is None:
        locked.started_at = now
    if new_status in Run.FINISHED:
        locked.finished_at = now
    if error:
        locked.error = error
    locked.save(update_fields=["status", "started_at", "finished_at", "error", "updated_at"])
    broadcast(locked.pk, {"type": "status", "status": locked.status, "error": locked.error})
    run.refresh_from_db()
    return locked


@transaction.atomic
def record_metrics(run: Run, role: str, step: int, values: dict) -> MetricPoint:
    point, _ = MetricPoint.objects.update_or_create(run=run, role=role, step=step, defaults={"values": values})
    broadcast(run.pk, {"type": "metrics", "role": role, "step": step, "values": values})
    return point
