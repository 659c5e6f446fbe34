"""One worker's page (/workers/<name>/, /api/workers/<name>/), as Celery Flower's worker page and
Ray's node view show one: its slots and queues, what it holds now (the run, the duty and where the
duty stands: waits.duty_states), the duties it held in the last day and how each ended, and the
tail of what it logged while it held them (logs.tail).

The history is read from what the product already records: the serve_duty tasks the worker ran
(task_log's TaskRun rows, a day's; the task's return value says how the duty ended) and, for what
no row names (the embedded server runs no Celery task), the runs' duty heartbeats naming it
(`node`), which keep each duty's last holding only.
"""
import ast
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from . import capacity, duties, logs, waits
from .models import Run, TaskRun
from .supervision import run_dir
from .turns import SERVE_TASK

HISTORY_SHOWN = 50
LOG_DUTIES = 5  # the newest holdings whose lines the page shows: 5 files' tails, read every 5 s
LOG_LINES = 100
# serve() returns how the duty ended (supervision.serve_claimed, run_engine); Celery's outcome
# says where it returned nothing: its pool process was killed (lost) or it raised (failure).
CELERY_OUTCOMES = {"lost": "lost", "failure": "failed", "revoked": "revoked"}


@dataclass
class Held:
    """One duty the worker held (or holds): from a serve_duty task or a duty heartbeat."""

    run_id: int
    duty: str
    started: datetime
    ended: datetime | None
    how: str  # holding | completed | stopped | handed back | taken over | group broke | failed | lost ...
    task: str | None = None


def _life(name: str, now: datetime) -> tuple[capacity.WorkerState | None, list[capacity.WorkerState], list]:
    """(its current life, its earlier lives of the last day, every live worker) from the overview."""
    shown = capacity.overview(now)
    lives = [worker for section in shown.values() for worker in section if worker.name == name]
    current = next((life for life in lives if life.restarted_at is None), None)
    return current, [life for life in lives if life is not current], shown["workers"]


def _from_tasks(name: str, current: capacity.WorkerState) -> list[Held]:
    """The serve_duty tasks it ran (task_log), but those that held nothing ("skipped": a run
    stopped, a duty another worker held; "draining": sent back to its queue, turns.turn_away)."""
    held = []
    for row in TaskRun.objects.filter(worker=name, name=SERVE_TASK).exclude(
            result__in=("skipped", "draining"))[:HISTORY_SHOWN]:
        try:
            run_id, duty = ast.literal_eval(row.args)[:2]
        except (ValueError, SyntaxError, TypeError):
            continue  # cut at 200 characters: never for a run id and a duty name
        if not isinstance(run_id, int) or not isinstance(duty, str):
            continue
        ended = row.started_at + timedelta(seconds=row.runtime_s) if row.runtime_s is not None else None
        if row.outcome == "running":
            # Still running in this life, or its worker died under it (kill -9 writes no end).
            alive = current.state == "live" and (current.started_at is None or row.started_at >= current.started_at)
            how = "holding" if alive else "lost"
        else:
            how = CELERY_OUTCOMES.get(row.outcome) or row.result or row.outcome
        held.append(Held(run_id, duty, row.started_at, ended, how, row.task_id))
    return held


def _from_heartbeats(name: str, runs: list[Run], known_tasks: set) -> list[Held]:
    """Each duty whose heartbeat names the worker and no task row does: its last holding."""
    held = []
    for run in runs:
        for duty, beat in run.heartbeats.items():
            if beat.get("node") != name or not beat.get("since") or (beat.get("task") in known_tasks):
                continue
            ended = beat.get("ended")
            if not ended:
                alive = duties.holder(run, duty, settings.RFTWEB_HEARTBEAT_TIMEOUT) is not None
                how = "holding" if alive and run.status in Run.ACTIVE else "lost"
            else:
                how = ("handed back" if beat.get("handed_back") else "group broke" if beat.get("broke")
                       else run.status if run.status in Run.FINISHED else "let go")
            held.append(Held(run.pk, duty, datetime.fromisoformat(beat["since"]),
                             datetime.fromisoformat(ended) if ended else None, how, beat.get("task")))
    return held


def _runs_named_by(name: str, since: datetime) -> list[Run]:
    """The runs changed since `since`, whose heartbeats may name the worker (read in Python: a JSON
    search of every duty's `node` is written differently on Postgres and SQLite, and a day has
    at most a few hundred runs)."""
    return [run for run in Run.objects.filter(updated_at__gte=since).only("pk", "heartbeats", "status")
            if any(beat.get("node") == name for beat in run.heartbeats.values() if isinstance(beat, dict))]


def detail(name: str, now: datetime | None = None) -> dict | None:
    """What the worker's page shows, or None for a worker not seen in the last day."""
    now = now or timezone.now()
    current, earlier, live = _life(name, now)
    if current is None:
        return None
    held = _from_tasks(name, current)
    named = _runs_named_by(name, now - capacity.LOST_SHOWN_FOR)
    held += _from_heartbeats(name, named, {one.task for one in held if one.task})
    held.sort(key=lambda one: one.started, reverse=True)
    held = held[:HISTORY_SHOWN]
    runs = Run.objects.in_bulk({one.run_id for one in held} | {hold.run_id for hold in current.holds})
    return {
        "embedded": settings.RFTWEB_EMBEDDED,
        "heartbeat_timeout_s": settings.RFTWEB_HEARTBEAT_TIMEOUT,
        "worker": current.as_json(),
        "heartbeat_age_s": None if settings.RFTWEB_EMBEDDED or current.last_seen is None  # a worker never registered
        else round((now - current.last_seen).total_seconds(), 1),
        "earlier": [life.as_json() for life in earlier],
        "holds": [_hold_json(hold, runs.get(hold.run_id), live) for hold in current.holds],
        "history": [_held_json(one, runs.get(one.run_id)) for one in held],
        "logs": _log_tail(held, runs),
    }


def _hold_json(hold: capacity.Holding, run: Run | None, live: list) -> dict:
    """A duty it holds now: where it stands as the run page's duty line says it, and the run's steps."""
    state = next((s for s in waits.duty_states(run, live) if s.duty == hold.duty), None) if run else None
    return {**asdict(hold), "since": hold.since and hold.since.isoformat(),
            "last_beat": hold.last_beat.isoformat(), "run_url": f"/runs/{hold.run_id}/",
            "state": state.state if state else "", "detail": state.detail if state else "",
            "explorer_step": run.explorer_step if run else None, "trainer_step": run.trainer_step if run else None,
            "total_steps": run.config.get("trainer", {}).get("total_steps") if run else None}


def _held_json(one: Held, run: Run | None) -> dict:
    return {"run_id": one.run_id, "run_name": run.name if run else "(deleted)", "duty": one.duty,
            "run_url": f"/runs/{one.run_id}/" if run else None, "started_at": one.started.isoformat(),
            "ended_at": one.ended and one.ended.isoformat(), "how": one.how,
            "runtime_s": round(((one.ended or timezone.now()) - one.started).total_seconds(), 1)}


def _log_tail(held: list[Held], runs: dict) -> list[dict]:
    """The newest lines it logged while it held its newest LOG_DUTIES duties, oldest first."""
    lines = []
    for one in held[:LOG_DUTIES]:
        run = runs.get(one.run_id)
        if run is None:
            continue
        until = one.ended and one.ended.timestamp() + 1  # its last line may be stamped just after the end's row
        for line in logs.tail(run_dir(run), one.duty, one.started.timestamp() - 1, until, LOG_LINES):
            lines.append({**line, "run_id": run.pk, "run_name": run.name})
    lines.sort(key=lambda line: line["time"])
    return lines[-LOG_LINES:]
