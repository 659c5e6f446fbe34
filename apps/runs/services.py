"""State changes of runs. Views, commands and workers call these, never the models directly."""
import math
from datetime import datetime

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


def finite_or_none(value):
    """Postgres JSON has no NaN or infinity; a diverged loss is stored as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


@transaction.atomic
def record_metrics(run: Run, role: str, step: int, values: dict) -> MetricPoint:
    values = {key: finite_or_none(value) for key, value in values.items()}
    point, _ = MetricPoint.objects.update_or_create(run=run, role=role, step=step, defaults={"values": values})
    broadcast(run.pk, {"type": "metrics", "role": role, "step": step, "values": values})
    return point


def validate_config(config: dict) -> "RunConfig":
    """The engine's schema, plus what a shared server adds: model directories confined to the
    allowed roots (stored resolved), and tasksets and feedback source runs that exist.
    Raises ConfigError naming each bad key."""
    from apps.tasksets.models import Taskset
    from workers.rft.config import ConfigError, ConfigIssue, RunConfig

    from .config_checks import model_issues, nul_issues

    parsed = RunConfig.from_dict(config)
    buffer = parsed.buffer
    issues = [
        ConfigIssue(f"buffer.{key}", f"no taskset named {name!r}; upload it or pick one of the tasksets page")
        for key, name in (("taskset", buffer.taskset), ("expert_taskset", buffer.expert_taskset), ("eval_taskset", buffer.eval_taskset))
        if name and "\x00" not in name and not Taskset.objects.filter(name=name).exists()  # NUL: nul_issues
    ]
    known_runs = set(Run.objects.filter(pk__in=parsed.feedback.source_runs).values_list("pk", flat=True))
    issues += [
        ConfigIssue("feedback.source_runs", f"no run with id {run_id}")
        for run_id in parsed.feedback.source_runs if run_id not in known_runs
    ]
    bad_models, resolved_models = model_issues(parsed)
    issues += [ConfigIssue(key, message) for key, message in bad_models]
    reported = {issue.key for issue in issues}
    issues += [ConfigIssue(key, message) for key, message in nul_issues(parsed.to_dict()) if key not in reported]
    if issues:
        raise ConfigError(issues)
    for key, directory in resolved_models.items():
        setattr(parsed.model, key.removeprefix("model."), directory)
    return parsed


def launch_run(owner, name: str, config: dict) -> Run:
    """Validate, create the run and, once that commits, hand it to the workers."""
    from workers import tasks

    parsed = validate_config(config)
    with transaction.atomic():
        run = Run.objects.create(name=name, owner=owner, config=parsed.to_dict(), mode=parsed.mode)
        transaction.on_commit(lambda: tasks.enqueue(tasks.start_run, run.pk))
    return run


def mark_running(run: Run) -> None:
    """A worker has the run going: starting -> running, once (the run's other role may be first)."""
    with transaction.atomic():
        if Run.objects.select_for_update().get(pk=run.pk).status == Status.STARTING:
            set_status(run, Status.RUNNING)


def pause_run(run: Run) -> Run:
    return set_status(run, Status.PAUSED)


def resume_run(run: Run) -> Run:
    return set_status(run, Status.RUNNING)


def stop_run(run: Run) -> Run:
    """Ask the workers to stop; they check the status every step. A run no worker has started yet
    stops at once."""
    if run.is_finished:
        raise InvalidTransition(f"run {run.pk} is already {run.status}")
    if run.status == Status.QUEUED:
        return set_status(run, Status.STOPPED)
    return set_status(run, Status.STOPPING)


PROGRESS_FIELDS = ("explorer_step", "trainer_step", "model_version")


def set_progress(run: Run, **progress: int) -> None:
    """Move the run's step counters and model version forward (never back: a replayed step
    after a restart must not make the dashboard jump)."""
    unknown = set(progress) - set(PROGRESS_FIELDS)
    if unknown:
        raise ValueError(f"unknown progress field(s) {sorted(unknown)}")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        changed = {k: v for k, v in progress.items() if v > getattr(locked, k)}
        if not changed:
            return
        Run.objects.filter(pk=run.pk).update(**changed)
        broadcast(run.pk, {"type": "progress", **changed})
    for key, value in changed.items():
        setattr(run, key, value)


HANDED_OVER = "watchdog"  # the holder the watchdog writes when it hands a dead worker's role on


def heartbeat(run: Run, role: str, worker: str) -> None:
    """`worker` is alive and holds `role` of the run; the watchdog resumes a role whose heartbeat expired."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().only("heartbeats").get(pk=run.pk)
        locked.heartbeats = {**locked.heartbeats, role: {"at": timezone.now().isoformat(), "worker": worker}}
        locked.save(update_fields=["heartbeats"])


def heartbeat_age(run: Run, role: str) -> float | None:
    """Seconds since the role's last heartbeat (None: it never had one)."""
    beat = run.heartbeats.get(role)
    if not beat:
        return None
    return (timezone.now() - datetime.fromisoformat(beat["at"])).total_seconds()


def claim_role(run: Run, role: str, worker: str, timeout: float) -> bool:
    """Take the role unless another worker holds it with a fresh heartbeat. A redelivered or
    duplicated task for a role that is being served then exits without touching the run."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        beat = locked.heartbeats.get(role)
        age = heartbeat_age(locked, role)
        if beat and beat["worker"] not in (worker, HANDED_OVER) and age is not None and age < timeout:
            return False
        heartbeat(locked, role, worker)
    return True
