"""The pause / resume / stop controls of a run, shared by the pages and the API.

The services decide what is legal; this decides which buttons a status offers. "resume" is the one
name for "continue this run": a paused run carries on in place, a failed or stopped one restarts
from its newest checkpoint (services.resume_run). starting → running is the worker's own step, not
the user's. Every researcher may watch every run; only its owner and curators may control it.
"""
from django.core.exceptions import PermissionDenied

from apps.accounts.roles import CURATOR, has_role

from . import services
from .models import Run

Status = Run.Status

CONTROLS = {  # action: (service, statuses that offer it)
    "pause": (services.pause_run, lambda status: Status.PAUSED in services.TRANSITIONS[status]),
    "resume": (services.resume_run, lambda status: status in (Status.PAUSED, Status.FAILED, Status.STOPPED)),
    "stop": (
        services.stop_run,
        lambda status: status == Status.QUEUED or Status.STOPPING in services.TRANSITIONS[status],
    ),
}


def may_control(user, run: Run) -> bool:
    return run.owner_id == user.pk or has_role(user, CURATOR)


def control_run(run: Run, action: str, user) -> Run:
    """Pause, resume or stop for `user`: PermissionDenied when it is not their run (and they are
    no curator), InvalidTransition when the status does not offer that control."""
    if not may_control(user, run):
        raise PermissionDenied(f"only the owner of run {run.name!r} ({run.owner}) or a curator may {action} it")
    change, offered = CONTROLS[action]
    if not offered(run.status):
        raise services.InvalidTransition(f"cannot {action} run {run.name!r}: it is {run.status}")
    return change(run)


def control_statuses() -> dict[str, list[str]]:
    """For each control, the statuses that offer it (the run page shows and hides its buttons live)."""
    return {
        action: [status for status in Status.values if offered(status)] for action, (_, offered) in CONTROLS.items()
    }
