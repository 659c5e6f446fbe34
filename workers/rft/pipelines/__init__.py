from . import experience_ops, task_ops  # noqa: F401  (registers the operators)
from .base import (
    EXPERIENCE_OPERATORS,
    TASK_OPERATORS,
    PipelineContext,
    build_operators,
    run_experience_operators,
    run_task_operators,
)
from .experience_ops import episodes, group_advantage

__all__ = [
    "EXPERIENCE_OPERATORS", "TASK_OPERATORS", "PipelineContext", "build_operators", "episodes", "group_advantage",
    "run_experience_operators", "run_task_operators",
]
