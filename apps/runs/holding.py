"""A duty's hold on its run: what a duty checks while it serves and waits (supervision serves
it; ranks waits on it too). The exceptions end the duty's serving, each in its own way
(supervision.serve_claimed)."""
import time

from . import services
from .models import Run
from .services import duties_of_run

Status = Run.Status
WAIT_SECONDS = 0.5  # how often a duty waiting for the other one looks again


class DutyLost(Exception):
    """Another worker holds this duty now (the watchdog handed it on, or the run was resumed)."""


class Stopped(Exception):
    """The run stopped (or ended) while the duty waited for the run's other duties."""


class HandBack(Exception):
    """The worker serving the duty is shutting down in order (SIGTERM): the duty saved what a
    resume needs at a step boundary and lets the run go, still active, for another worker (the
    watchdog sends the duty on; the run carries on from that checkpoint)."""


def still_served(run: Run, duty: str, worker: str) -> bool:
    """Whether the run is still to be served (Run.SERVED) by this duty; DutyLost once `worker`
    no longer holds it. What a duty waiting for others looks at, so that a stop reaches it."""
    run.refresh_from_db(fields=["status", "heartbeats"])
    if services.holder(run, duty) != worker:
        raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
    return run.status in Run.SERVED


def wait_while_paused(run: Run, duty: str, worker: str, interval: float = 1.0, leaving=lambda: False) -> str:
    """The run's status once it is not paused (or, paused, once `leaving()`: its worker shuts
    down); DutyLost as soon as `worker` no longer holds `duty`, or the duty is no longer the run's
    (an explorer beyond a lowered explorer.engine_num)."""
    while True:
        run.refresh_from_db(fields=["status", "heartbeats", "config"])
        if services.holder(run, duty) != worker:
            raise DutyLost(f"run {run.pk}: worker {worker} no longer holds the {duty} duty")
        if duty not in duties_of_run(run):
            raise DutyLost(f"run {run.pk}: {duty} is no longer one of its duties (explorers: "
                           f"{run.config['explorer']['engine_num']})")
        if run.status != Status.PAUSED or leaving():
            return run.status
        time.sleep(interval)


def pause() -> None:
    time.sleep(WAIT_SECONDS)
