"""Task operators: choose which tasks the explorer may draw and in what priority; grow the taskset.

The explorer draws the highest priority tasks first, then the least sampled, ties broken by a
seeded shuffle; so with no operators it walks the taskset in epochs.
"""
from dataclasses import asdict, replace

from .. import datasets
from ..experience import Task
from .base import TASK_OPERATORS


@TASK_OPERATORS.register("filter_length")
def filter_length(tasks, ctx, max_tokens: int = 256):
    """Tasks whose prompt, as the workflow encodes it, fits in max_tokens (longer ones would be cut)."""
    workflow = ctx.workflow

    def prompt_tokens(task) -> int:
        text, _ = workflow.encode_prompt(workflow.messages(task))  # the ids it returns are already cut
        return len(workflow.tokenizer(text, add_special_tokens=False)["input_ids"])

    return [t for t in tasks if prompt_tokens(t) <= max_tokens]


@TASK_OPERATORS.register("filter_difficulty")
def filter_difficulty(tasks, ctx, min: float | None = None, max: float | None = None):
    lo = float("-inf") if min is None else min
    hi = float("inf") if max is None else max
    return [t for t in tasks if lo <= t.difficulty <= hi]


@TASK_OPERATORS.register("priority")
def priority(tasks, ctx, difficulty: float = 0.0, use_count: float = 0.0):
    """priority += difficulty * task.difficulty - use_count * task.times_sampled.
    difficulty < 0 is an easy-first curriculum; use_count > 0 spreads draws over the taskset."""
    return [replace(t, priority=t.priority + difficulty * t.difficulty - use_count * t.times_sampled) for t in tasks]


@TASK_OPERATORS.register("synthesize_harder")
def synthesize_harder(tasks, ctx, min_reward: float = 1.0, max_new: int = 4):
    """Harder arithmetic variants of tasks the model now solves (latest group mean reward >=
    min_reward), each task expanded once; the new tasks are stored in the task source."""
    expanded = {t.metadata.get("harder_variant_of") for t in tasks}
    solved = [
        t for t in tasks
        if ctx.task_rewards.get(t.id, float("-inf")) >= min_reward and t.id not in expanded
        and "op" in t.metadata
    ][:max_new]
    if not solved:
        return tasks
    new = []
    for t in solved:
        variant = datasets.harder_variant(asdict(t), seed=ctx.seed)
        new.append(Task(id=None, **variant | {"metadata": {**variant["metadata"], "harder_variant_of": t.id}}))
    return tasks + ctx.task_source.add_tasks(new)
