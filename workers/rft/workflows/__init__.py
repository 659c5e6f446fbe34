from . import single_turn  # noqa: F401  (registers the workflow)
from .base import WORKFLOWS, Workflow

__all__ = ["WORKFLOWS", "Workflow", "workflow_args_problems"]


def workflow_args_problems(workflow: str, args: dict) -> list[tuple[str, str]]:
    """(key under explorer.workflow_args, problem) for each bad setting of the named workflow."""
    if workflow not in WORKFLOWS:
        return []  # explorer.workflow itself is reported
    return [(str(key), "unknown key; this workflow takes no settings") for key in args]
