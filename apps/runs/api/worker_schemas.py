"""What the API answers about the workers (/api/workers/ and a worker's own, its drain), as ninja
Schemas, and the Workers page's data that /api/workers/ answers (`workers_json`). The rest of the
API's answers: schemas.py, whose rule holds here too: a key added to a builder and not to its
schema is dropped. Times the workers report are ISO strings as stored."""

from typing import Any

from django.conf import settings
from ninja import Field, Schema

from rftweb.celery import queue_lengths

from .. import capacity, task_log, turns
from ..capacity import ALL_QUEUES


class HoldOut(Schema):
    run_id: int
    run_name: str
    run_status: str
    duty: str
    since: str | None
    last_beat: str
    run_url: str


class WorkerOut(Schema):
    name: str = Field(description="its Celery hostname")
    host: str
    pid: int | None
    queues: list[str]
    slots: int | None = Field(description="null when embedded: no limit")
    free: int | None
    gpus: list[dict[str, Any]] = Field(description='each {"name", "memory_gb", "used_gb"}')
    memory_gb: float | None = Field(description="the memory its processes may use (GiB); null if not reported")
    cpus: int | None = Field(description="the cores its processes may use; null if not reported")
    version: str = Field(description="the git commit it runs")
    started_at: str | None
    last_seen: str | None
    state: str = Field(description="live, lost or stopped")
    holds: list[HoldOut]
    stopped_at: str | None = Field(description="when it stopped in order (stopped only)")
    restarted_at: str | None = Field(description="an earlier life of a worker of this name: when it started again")
    url: str = Field(description="its page, /workers/<name>/ (the name quoted)")
    drain: dict[str, Any] = Field(description='{"by", "at"} while a curator has it drained (it finishes what it '
                                              "holds and takes no new duty; its free is 0); {} otherwise")
    usage: dict[str, Any] = Field(description='what its processes used at its last beat, {"rss_gb", "cpu_percent"} '
                                              "(percent of one core; null at its first beat); {} when not live")


class WaitingOut(Schema):
    run_id: int
    run_name: str
    duty: str
    queue: str
    asked: str = Field(description="when the duty first asked for a slot (a hand-over keeps it)")
    why: str = Field(description="new, handed back (its worker stopped in order) or sent on (its worker was lost)")
    run_url: str


class WorkersOut(Schema):
    embedded: bool
    heartbeat_timeout_s: float
    workers: list[WorkerOut]
    lost: list[WorkerOut] = Field(description="lost in the last day")
    stopped: list[WorkerOut] = Field(description="stopped in the last day")
    waiting: dict[str, list[WaitingOut]] = Field(
        description="per queue, the duties waiting for a slot, the next to get one first (who asked first)")
    tasks: list[dict[str, Any]] = Field(
        description="the newest tasks the workers ran (the last day's) but the periodic ones: task_id, name, args, "
                    "worker, started_at, runtime_s (null while it runs), outcome (running, success, failure, lost...), "
                    "result")
    housekeeping: list[dict[str, Any]] = Field(
        description="each periodic task Celery beat sends (the watchdog, the search index...): name, runs and "
                    "failed (in the last day), newest (its newest run as in tasks, or null); none embedded, where "
                    "no Celery beat runs")
    queued: dict[str, int] | None = Field(
        description="per queue, the tasks waiting in the broker (Celery's queue length); null embedded or when "
                    "the broker does not answer")


class WorkerHoldOut(HoldOut):
    state: str = Field(description="where the duty stands, as the run page's duty line says it (running, paused...)")
    detail: str = Field(description="the run page's duty line: what its engine does, the step")
    explorer_step: int | None
    trainer_step: int | None
    total_steps: int | None = Field(description="the run's trainer.total_steps")


class HeldOut(Schema):
    run_id: int
    run_name: str = Field(description='"(deleted)" for a run deleted since')
    run_url: str | None
    duty: str
    started_at: str
    ended_at: str | None = Field(description="null while it holds it, or when its worker died under it")
    runtime_s: float
    how: str = Field(description="how it ended: holding (still), completed, stopped, handed back, taken over, "
                                 "group broke, failed, lost the database, lost (its process was killed), let go")


class WorkerDetailOut(Schema):
    embedded: bool
    heartbeat_timeout_s: float
    worker: WorkerOut
    heartbeat_age_s: float | None = Field(description="seconds since its last heartbeat; null embedded")
    earlier: list[WorkerOut] = Field(description="its earlier lives under this name, in the last day")
    holds: list[WorkerHoldOut]
    history: list[HeldOut] = Field(description="the duties it held in the last day, newest first (at most 50)")
    logs: list[dict[str, Any]] = Field(
        description="the newest lines (at most 100, oldest first) it logged while it held its 5 newest duties, "
                    "each as the run's log lines with run_id and run_name")


class DrainedOut(WorkerDetailOut):
    message: str = Field(description="what the worker does now")


def workers_json() -> dict:
    """What the Workers page shows and /api/workers/ answers: capacity.overview(), turns.queues(),
    the broker's queue lengths and the newest tasks."""
    return {
        "embedded": settings.RFTWEB_EMBEDDED,
        "heartbeat_timeout_s": settings.RFTWEB_HEARTBEAT_TIMEOUT,
        **{section: [worker.as_json() for worker in workers] for section, workers in capacity.overview().items()},
        "waiting": {queue: [one.as_json() for one in duties] for queue, duties in turns.queues().items()},
        "queued": queue_lengths(ALL_QUEUES),
        "tasks": task_log.recent(),
        "housekeeping": [] if settings.RFTWEB_EMBEDDED else task_log.housekeeping(),  # no beat runs there
    }
