from . import multi_turn, single_turn, tool_calling  # noqa: F401  (registers the workflows)
from .base import WORKFLOWS, TaskFailed, Workflow

__all__ = ["WORKFLOWS", "TaskFailed", "Workflow", "rollout_tokens", "workflow_args_problems"]


def workflow_args_problems(workflow: str, args: dict) -> list[tuple[str, str]]:
    """(key under explorer.workflow_args, problem) for each bad setting of the named workflow:
    each workflow declares its settings (`Workflow.Args`, a pydantic model) and checks them (`check_args`)."""
    if workflow not in WORKFLOWS:
        return []  # explorer.workflow itself is reported
    return WORKFLOWS.get(workflow).args_problems(args)


def rollout_tokens(config) -> int:
    """The most tokens one of the run's rollouts holds (Workflow.context_tokens): the rollout
    engine's context, and what the model's positions must cover."""
    workflow = WORKFLOWS.get(config.explorer.workflow)
    return workflow.context_tokens(config.model.max_prompt_tokens, config.explorer.max_new_tokens,
                                   workflow.settings(config.explorer.workflow_args))
