from . import single_turn  # noqa: F401  (registers the workflow)
from .base import WORKFLOWS, Workflow

__all__ = ["WORKFLOWS", "Workflow"]
