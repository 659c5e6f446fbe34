"""Text environments for multi-turn workflows, by name (explorer.workflow_args.env)."""
from . import toy_text  # noqa: F401  (registers the environments)
from .base import ENVIRONMENTS, Step, TextEnvironment, parse_action

__all__ = ["ENVIRONMENTS", "Step", "TextEnvironment", "parse_action"]
