"""A duty's hold on its run: what a duty checks while it serves and waits (supervision serves
it; ranks waits on it too). The exceptions end the duty's serving, each in its own way
(supervision.serve_claimed)."""
import time

from django.db import transaction
from django.utils import timezone

from . import duties, services
from .duties import NODE_DUTY, duties_of_run
from .models import Run

Status = Run.Status
WAIT_SECONDS = 0.5  # how often a duty waiting for the other one looks again


class DutyLost(Exception):
    """Another worker holds this duty now (the watchdog handed it on, or the run was resumed)."""


class Stopped(Exception):
    """The run stopped (or ended) while the duty waited for the run's other duties."""


class HandBack(Exception):
    """The worker serving the duty is shutting down in order (SIGTERM), or a curator handed the
    duty back (`hand_back`): the duty saved what a resume needs at a step boundary and lets the run
    go, still active, for another worker (it is queued again at once, keeping its place: turns.py;
    the run carries on from that checkpoint)."""


def hand_back(run: Run, duty: str, by: str) -> None:
    """Ask the worker holding the run's `duty` to hand it back to its queue (the Workers page, for
    a curator): it saves at its next step and lets go, as on an orderly shutdown. InvalidTransition
    for a run not served, a duty no live worker holds, or a trainer machine's duty (it leaves with
    the trainer's group: hand back the trainer)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if locked.status not in Run.SERVED:
            raise services.InvalidTransition(f"run {locked.name!r} is {locked.status}: no duty of it to hand back")
        if duty.startswith(NODE_DUTY):
            raise services.InvalidTransition(f"{duty} leaves with its trainer's group: hand back the trainer")
        if duty not in duties.workers_holding(locked):
            raise services.InvalidTransition(f"no live worker holds the {duty} duty of run {locked.name!r}")
        if duties.is_explorer(duty) and locked.config.get("synchronizer", {}).get("method") == "nccl":
            # As set_explorers refuses to change their number: handed back, one broke the group, the
            # trainer waited synchronizer.timeout_s and restarted from its checkpoint.
            raise services.InvalidTransition(
                f"{duty} is in the trainer's nccl weight group, of a fixed size: handing it back would break the "
                "group; hand back the trainer (the group goes with it), or stop the run and resume it")
        asked = {"by": by, "at": timezone.now().isoformat()}
        locked.heartbeats = {**locked.heartbeats, duty: {**locked.heartbeats[duty], "hand_back": asked}}
        locked.save(update_fields=["heartbeats"])


def still_served(run: Run, duty: str, worker: str) -> bool:
    """Whether the run is still to be served (Run.SERVED) by this duty; DutyLost once `worker`
    no longer holds it. What a duty waiting for others looks at, so that a stop reaches it."""
    run.refresh_from_db(fields=["status", "heartbeats"])
    if duties.holder(run, duty) != worker:
        raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
    return run.status in Run.SERVED


def wait_while_paused(run: Run, duty: str, worker: str, interval: float = 1.0, leaving=lambda: False) -> str:
    """The run's status once it is not paused (or, paused, once `leaving()`: its worker shuts
    down); DutyLost as soon as `worker` no longer holds `duty`, or the duty is no longer the run's
    (an explorer beyond a lowered explorer.engine_num)."""
    while True:
        run.refresh_from_db(fields=["status", "heartbeats", "config"])
        if duties.holder(run, duty) != worker:
            raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
        if duty not in duties_of_run(run):
            raise DutyLost(f"run {run.pk}: {duty} is no longer one of its duties (explorers: "
                           f"{run.config['explorer']['engine_num']})")
        if run.status != Status.PAUSED or leaving():
            return run.status
        time.sleep(interval)


def pause() -> None:
    time.sleep(WAIT_SECONDS)
