"""Operator registries and how a configured list of operators runs.

A config lists operators as names or mappings: `["drop_truncated", {name: reward_filter, min: 0.5}]`.
Experience operators: op(experiences, ctx, **params) -> (experiences, metrics).
Task operators: op(tasks, ctx, **params) -> tasks (filtered, re-prioritised or extended).
Their params are what a config may set, so each is declared (`pipeline_operator`) and checked at
launch with the rest of the config (config.operator_issues), as reward fns' are.
"""
from dataclasses import dataclass, field

from ..registry import Registry

EXPERIENCE_OPERATORS = Registry("experience operator")
TASK_OPERATORS = Registry("task operator")


def pipeline_operator(registry: Registry, name: str, **rules: dict):
    """Registers op(items, ctx, **params) as operator `name` of registry. Each param after (items,
    ctx) needs an annotation (bool, int, float, str, or one of them | None) and a default, and
    follows rules[param]: rules as config_issues.field_of reads them (ge, gt, le, lt, choices, check),
    e.g. max_new={"ge": 1, "le": 1024}."""

    def add(op):
        op.rules = rules
        return registry.register(name)(op)

    return add


@dataclass
class PipelineContext:
    """What operators may need besides the data itself."""

    workflow: object = None  # prompt encoding, for length filters
    task_source: object = None  # where synthetic tasks go
    buffer: object = None
    seed: int = 0
    # task id -> mean reward of its latest group, filled by the explorer (synthesis reads it)
    task_rewards: dict = field(default_factory=dict)


def build_operators(registry: Registry, specs: list) -> list[tuple[str, object, dict]]:
    ops = []
    for spec in specs:
        params = dict(spec) if isinstance(spec, dict) else {"name": spec}
        name = params.pop("name")
        ops.append((name, registry.get(name), params))
    return ops


def run_experience_operators(ops, experiences: list, ctx: PipelineContext) -> tuple[list, dict]:
    metrics = {}
    for name, op, params in ops:
        experiences, op_metrics = op(experiences, ctx, **params)
        metrics.update({f"{name}/{key}": value for key, value in op_metrics.items()})
    return experiences, metrics


def run_task_operators(ops, tasks: list, ctx: PipelineContext) -> list:
    for _, op, params in ops:
        tasks = op(tasks, ctx, **params)
    return tasks
