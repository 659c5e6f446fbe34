"""Task operators: choose which tasks the explorer may draw and in what priority; grow the taskset.

The explorer draws the highest priority tasks first, then the least sampled, ties broken by a
seeded shuffle; so with no operators it walks the taskset in epochs.
"""
from dataclasses import asdict, replace

from .. import datasets
from ..experience import Task
from ..tokens import encode_start
from .base import TASK_OPERATORS, pipeline_operator


@pipeline_operator(TASK_OPERATORS, "filter_length", max_tokens={"ge": 1, "le": 131_072})
def filter_length(tasks, ctx, max_tokens: int = 256):
    """Tasks whose prompt, as the workflow encodes it, fits in max_tokens (longer ones would be cut)."""
    workflow = ctx.workflow

    def fits(task) -> bool:
        text = workflow.encode_prompt(workflow.messages(task)).text  # the ids it returns are already cut
        # One token past the bound tells a prompt that does not fit, without tokenizing all of it
        # (a 1 MiB cell: 2.1-8.5 s a tokenization, every step, for every task).
        return len(encode_start(workflow.tokenizer, text, max_tokens + 1)) <= max_tokens

    return [t for t in tasks if fits(t)]


@pipeline_operator(TASK_OPERATORS, "filter_difficulty")
def filter_difficulty(tasks, ctx, min: float | None = None, max: float | None = None):
    lo = float("-inf") if min is None else min
    hi = float("inf") if max is None else max
    return [t for t in tasks if lo <= t.difficulty <= hi]


@pipeline_operator(TASK_OPERATORS, "priority")
def priority(tasks, ctx, difficulty: float = 0.0, use_count: float = 0.0):
    """priority += difficulty * task.difficulty - use_count * task.times_sampled.
    difficulty < 0 is an easy-first curriculum; use_count > 0 spreads draws over the taskset."""
    return [replace(t, priority=t.priority + difficulty * t.difficulty - use_count * t.times_sampled) for t in tasks]


# Every explorer step stores up to max_new new tasks for the run: its own (apps/tasksets Task.run),
# which the taskset and other runs on it do not see, gone with the run.
@pipeline_operator(TASK_OPERATORS, "synthesize_harder", max_new={"ge": 1, "le": 1024})
def synthesize_harder(tasks, ctx, min_reward: float = 1.0, max_new: int = 4):
    """Harder arithmetic variants of tasks the model now solves (latest group mean reward >=
    min_reward), each task expanded once; the new tasks are stored in the task source. Which
    tasks were expanded is read from the task source, not from `tasks`: an operator before this
    one may have filtered the variants out (filter_difficulty {max}: the same variants were made
    again every step)."""
    candidates = [t for t in tasks if ctx.task_rewards.get(t.id, float("-inf")) >= min_reward and "op" in t.metadata]
    if not candidates:
        return tasks
    expanded = {t.metadata.get("harder_variant_of") for t in ctx.task_source.tasks()}
    solved = [t for t in candidates if t.id not in expanded][:max_new]
    if not solved:
        return tasks
    new = []
    for t in solved:
        variant = datasets.harder_variant(asdict(t), seed=ctx.seed)
        new.append(Task(id=None, **variant | {"metadata": {**variant["metadata"], "harder_variant_of": t.id}}))
    return tasks + ctx.task_source.add_tasks(new)
