"""Task selectors: which tasks an explorer step draws (buffer.task_selector), after the task
pipeline has filtered and re-prioritised the taskset. Trinity-RFT's "task selectors"
(docs/sphinx_doc/source/tutorial/develop_selector.md; trinity/buffer/selector/selector.py) and its
online task curriculum (BOTS, examples/bots), over what a run stores:

- default: highest priority, then least drawn by this run, ties in a seeded shuffle that changes
  every epoch (first_tasks).
- sequential: the taskset in order, epoch after epoch (Trinity's SequentialSelector).
- difficulty_based: learns each task's pass rate from this run's own groups and draws the tasks
  whose estimate is nearest a target, 0.5 by default: the groups with reward variance, which GRPO
  learns from (Trinity's DifficultyBasedSelector, BOTS's Thompson sampling). Tasks this run never
  drew come first; tasks solved by every rollout of `retire_after` groups in a row are retired.

A replayed step picks what it picked: a selection reads only what the run stored as of the step's
start (each task's draws and TaskStats, written together when a step finishes: TaskSource.mark_sampled),
the run's seed and the step's number. Explorers sharing a step read the batch its first explorer
picked (protocols.StepClaims.open), and the one that finishes the step records what was learned.

A selector is a class registered by name; its constructor takes (seed, batch_size) and then the
params a config may give it, each annotated, defaulted and bounded by the rules it registers with
(config_issues.params_model, as pipeline operators').
"""
import heapq
import math
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from .experience import TaskStats
from .registry import Registry

TASK_SELECTORS = Registry("task selector")
DEFAULT = "default"


def task_selector(name: str, **rules: dict):
    """Registers a TaskSelector subclass as `name`; rules bound its params as pipeline_operator's do."""

    def add(cls):
        cls.rules = rules
        return TASK_SELECTORS.register(name)(cls)

    return add


def selector_spec(spec: str | Mapping) -> tuple[str, dict]:
    """(name, params) of buffer.task_selector: a name, or {name: ..., <params>}."""
    if isinstance(spec, str):
        return spec, {}
    params = dict(spec)
    return params.pop("name"), params


def build_selector(config) -> "TaskSelector":
    name, params = selector_spec(config.buffer.task_selector)
    return TASK_SELECTORS.get(name)(config.seed, config.explorer.batch_size, **params)


def first_tasks(tasks: Sequence, seed: int, n: int) -> list:
    """The n first of `tasks` (Tasks, or TaskKeys: what orders them) in the default order:
    highest priority, then least drawn, ties in a seeded shuffle that changes every epoch."""
    return heapq.nsmallest(n, tasks, key=default_order(seed))


def default_order(seed: int):
    def key(task):
        shuffle = zlib.crc32(f"{seed}:{task.times_sampled}:{task.id}".encode())
        return (-task.priority, task.times_sampled, shuffle)

    return key


def pass_rate(rewards: Sequence[float]) -> float:
    """A group's pass rate: its rollouts' mean reward, each read in [0, 1] (exact_match's 0 or 1
    is a pass or a fail; a reward model's scale is no pass rate, and a weighted sum above 1 passes)."""
    return sum(min(max(reward or 0.0, 0.0), 1.0) for reward in rewards) / len(rewards)


class TaskSelector:
    """Picks a step's batch: at most batch_size of `tasks` (Tasks or TaskKeys, in taskset order,
    with this run's draws and stats as of the step's start), in batch order."""

    learns = False  # whether it records TaskStats from the groups (learn)

    def __init__(self, seed: int, batch_size: int):
        self.seed, self.batch_size = seed, batch_size

    def select(self, tasks: Sequence, step: int) -> list:
        raise NotImplementedError

    def learn(self, picked: Sequence, groups: Mapping[int, tuple[float, int]],
              step: int) -> tuple[dict[int, TaskStats], dict[str, float]]:
        """What step `step`'s groups teach: {task id: (pass rate, rollouts)} of the `picked` tasks
        (as of the step's start) that have a group -> (their new TaskStats, the step's
        selector/ metrics)."""
        return {}, {}

    def totals(self, task_source) -> dict[str, float]:
        """The selector/ metrics of the whole run so far, read from `task_source` once a step's
        draws and stats are recorded: what the run stored, whichever explorer or process learned it."""
        return {}


@task_selector(DEFAULT)
class Default(TaskSelector):
    """Highest priority first (the task pipeline's priority operator, a taskset's own), then
    least drawn, ties in a seeded shuffle per epoch."""

    def select(self, tasks, step):
        return first_tasks(tasks, self.seed, self.batch_size)


@task_selector("sequential")
class Sequential(TaskSelector):
    """The taskset in order, epoch after epoch: least drawn first, then taskset order. As
    Trinity's SequentialSelector.get_indices, whose batch wraps from the taskset's end to its start
    ([8, 9, 0, 1] of 10 tasks by 4); priority is not read."""

    def select(self, tasks, step):
        return [tasks[i] for i in heapq.nsmallest(self.batch_size, range(len(tasks)),
                                                  key=lambda i: (tasks[i].times_sampled, i))]


@task_selector(
    "difficulty_based",
    target_reward={"ge": 0, "le": 1}, lamb={"ge": 0, "lt": 1}, tau={"ge": 0, "le": 100},
    retire_after={"ge": 0, "le": 1000},
)
class DifficultyBased(TaskSelector):
    """Each task's pass rate as a Beta(alpha, beta) over its groups' passes and fails, older
    evidence discounted by (1 - lamb) a step; the tasks whose pass rate (a draw from the Beta with
    do_sample, else its mean) is nearest target_reward come first. tau 0 takes them greedily; above
    0, at random with weights softmax(-|target_reward - p| / tau). Tasks this run never drew come
    before any (in the default order: a run's first epoch is the default's); retired ones after
    all. retire_after N > 0 retires a task once N of its groups in a row had every rollout pass:
    the model solves it every time. When fewer than a batch are left, retired tasks fill it."""

    learns = True

    # Defaults: BOTS's run of Trinity's selector (examples/bots/bots.yaml: lamb 0.1, target_reward
    # 0.5, tau 0, do_sample true). Trinity's m (rollouts a group) is the group's own count here.
    # lamb, measured (docs/task-selection.md): on a taskset the model learns (the quick demo's MIX
    # on 80 addition tasks, 150 steps), a slower 0.01 kept estimates from groups long past and drew
    # solved tasks: groups of equal rewards over the second half 0.38 (0.17 with 0.1, 0.155 in the
    # default order); on a taskset of fixed pass rates 30 batches long it forgot between draws
    # instead (the drawn tasks' distance from 0.5: 0.24 with 0.1, 0.12 with 0.01, 0.28 default).
    def __init__(self, seed: int, batch_size: int, *, target_reward: float = 0.5, lamb: float = 0.1,
                 tau: float = 0.0, do_sample: bool = True, retire_after: int = 0):
        super().__init__(seed, batch_size)
        self.target_reward, self.lamb, self.tau = target_reward, lamb, tau
        self.do_sample, self.retire_after = do_sample, retire_after

    def retired(self, stats: TaskStats | None) -> bool:
        return self.retire_after > 0 and stats is not None and stats.solved_streak >= self.retire_after

    def beta(self, stats: TaskStats | None, step: int) -> tuple[float, float]:
        """(alpha, beta) at the start of `step`. Trinity's BaseBetaPREstimator._update
        (trinity/buffer/selector/difficulty_estimator.py), once per step for every task:
            alpha <- (1 - lamb) alpha + lamb + (1 - rho) s + rho p~ m,   beta likewise with f,
        s, f: a group's passes and fails (0 for a task without one). With rho 0 (p~ interpolates two
        reference models' pass rates, which a taskset here does not hold), alpha - 1 is the passes
        discounted by (1 - lamb) a step since: stored as of the task's last group (learn), so a
        step updates only its own tasks' rows; alpha and beta start at 1 (Beta(1, 1))."""
        if stats is None:
            return 1.0, 1.0
        # Steps seen_step + 1 .. step - 1 decayed it. (None, unless a step ran again after it was
        # recorded: one whose every rollout an operator dropped is not stored, and a resume replays it.)
        decay = (1 - self.lamb) ** max(0, step - 1 - stats.seen_step)
        return 1 + stats.successes * decay, 1 + stats.failures * decay

    def estimate(self, task, step: int) -> float:
        alpha, beta = self.beta(task.stats, step)
        return alpha / (alpha + beta)

    def select(self, tasks, step):
        n = self.batch_size
        unseen = [task for task in tasks if task.times_sampled == 0]
        retired = [task for task in tasks if task.times_sampled and self.retired(task.stats)]
        active = [task for task in tasks if task.times_sampled and not self.retired(task.stats)]
        picked = first_tasks(unseen, self.seed, n)
        picked += self._nearest(active, step, n - len(picked))
        return picked + first_tasks(retired, self.seed, n - len(picked))

    def _nearest(self, tasks: list, step: int, n: int) -> list:
        """The n of `tasks` whose pass rate is nearest the target, as Trinity's
        DifficultyBasedSelector.get_scores and get_indices: scores -|target_reward - p|, p drawn
        from Beta(alpha, beta) with do_sample (predict_pr); tau 0: the n best (topk), ties in the
        default order; else n drawn without replacement, weights softmax(scores / tau)
        (torch.multinomial there; the Gumbel top-k here, the same distribution). The draws are
        seeded by the run's seed and the step, as Trinity's by seed + current_index."""
        if n <= 0 or not tasks:
            return []
        alpha, beta = np.array([self.beta(task.stats, step) for task in tasks]).T
        rng = np.random.default_rng([self.seed, step])
        p = rng.beta(alpha, beta) if self.do_sample else alpha / (alpha + beta)
        scores = -np.abs(self.target_reward - p)
        if self.tau > 0:
            scores = scores / self.tau + rng.gumbel(size=len(tasks))
        tie = default_order(self.seed)
        return [tasks[i] for i in heapq.nsmallest(n, range(len(tasks)), key=lambda i: (-scores[i], tie(tasks[i])))]

    def learn(self, picked, groups, step):
        learned, gaps, estimates = {}, [], []
        for task in picked:
            if task.times_sampled:
                estimates.append(self.estimate(task, step))
            if task.id not in groups:
                continue  # failed (workflows.TaskFailed): no evidence
            rate, rollouts = groups[task.id]
            before = task.stats or TaskStats(0.0, 0.0, step)
            decay = (1 - self.lamb) ** max(0, step - before.seen_step)
            solved = rate >= 1.0
            learned[task.id] = TaskStats(
                successes=before.successes * decay + rate * rollouts,
                failures=before.failures * decay + (1 - rate) * rollouts,
                seen_step=step,
                solved_streak=before.solved_streak + 1 if solved else 0,
            )
            gaps.append(abs(self.target_reward - rate))
        metrics = {
            "selector/unseen": sum(task.times_sampled == 0 for task in picked),
            "selector/retired_drawn": sum(self.retired(task.stats) for task in picked),
        }
        if estimates:
            metrics["selector/estimated_pass_rate"] = math.fsum(estimates) / len(estimates)
        if gaps:
            metrics["selector/target_gap"] = math.fsum(gaps) / len(gaps)
        return learned, metrics

    def totals(self, task_source):
        # The tasks retired now, not those a step retired: that chart was zeros but for a step
        # here and there, and a group that fails puts a retired task back, which it never showed.
        retired = task_source.count_solved(self.retire_after) if self.retire_after else 0
        return {"selector/retired_total": retired}
