"""Task selectors (workers/rft/task_selectors.py, buffer.task_selector): what each draws, from what the
run stored as of a step's start. The explorer over in-memory stores here, with a stand-in for the
engine and reward whose tasks pass at known rates; the tiny model end to end:
test_task_selector_learning.py; Postgres and SQLite: tests/contract, tests/apps/runs/test_explorer_selection.py."""
import copy
import math
import random
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from workers.rft.config import ConfigError
from workers.rft.experience import Experience, Task, TaskKey, TaskStats
from workers.rft.explorer import Explorer
from workers.rft.memory import InMemoryBuffer, InMemoryMetrics, InMemoryTaskSource
from workers.rft.task_selectors import TASK_SELECTORS, DifficultyBased, first_tasks, pass_rate

from .conftest import make_config


def selector(name: str, batch_size: int = 4, seed: int = 0, **params):
    return TASK_SELECTORS.get(name)(seed, batch_size, **params)


def keys(n: int, draws=None, stats=None, priority=None) -> list[TaskKey]:
    draws, stats, priority = draws or {}, stats or {}, priority or {}
    return [TaskKey(i, priority.get(i, 0.0), draws.get(i, 0), stats.get(i)) for i in range(n)]


def ids(tasks) -> list[int]:
    return [task.id for task in tasks]


# ---- default: as the explorer always drew -------------------------------------------------------------


def test_default_is_the_order_the_explorer_drew_in_before_selectors():
    """Highest priority, then least drawn, ties in a shuffle seeded by (seed, draws, id): the
    formula Explorer.first_tasks had, written out again."""
    rng = random.Random(3)
    tasks = [TaskKey(i, rng.choice([0.0, 0.0, 1.0]), rng.randint(0, 3)) for i in range(50)]

    def legacy(task):
        return (-task.priority, task.times_sampled, zlib.crc32(f"7:{task.times_sampled}:{task.id}".encode()))

    assert ids(selector("default", 12, seed=7).select(tasks, step=5)) == ids(sorted(tasks, key=legacy)[:12])
    assert ids(first_tasks(tasks, 7, 12)) == ids(sorted(tasks, key=legacy)[:12])


def test_default_shuffles_each_epoch_anew():
    first = ids(selector("default", 50).select(keys(50), 0))
    second = ids(selector("default", 50).select(keys(50, draws=dict.fromkeys(range(50), 1)), 0))
    assert sorted(first) == sorted(second) == list(range(50)) and first != second


# ---- sequential ---------------------------------------------------------------------------------------


def walk(name: str, n: int, batch_size: int, steps: int, **params) -> list[list[int]]:
    """Each step's batch over in-memory draws, as the explorer marks them."""
    draws, batches = {}, []
    chooser = selector(name, batch_size, **params)
    for step in range(steps):
        batch = ids(chooser.select(keys(n, draws), step))
        batches.append(batch)
        for task_id in batch:
            draws[task_id] = draws.get(task_id, 0) + 1
    return batches


def test_sequential_walks_the_taskset_in_order_and_wraps_as_trinitys_does():
    # Trinity's SequentialSelector.get_indices: start = current_index % size, the end wrapping to 0.
    assert walk("sequential", 10, 4, 5) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]


def test_sequential_reads_no_priority_and_draws_what_there_is_when_the_batch_is_larger():
    tasks = keys(3, priority={2: 5.0})
    assert ids(selector("sequential", 8).select(tasks, 0)) == [0, 1, 2]
    assert ids(selector("default", 8).select(tasks, 0))[0] == 2


def test_the_config_refuses_a_priority_operator_sequential_would_not_read():
    with pytest.raises(ConfigError) as refused:
        make_config(buffer={"task_selector": "sequential", "task_pipeline": ["filter_length", "priority"]})
    (issue,) = refused.value.errors
    assert issue.key == "buffer.task_pipeline[1]" and "'sequential'" in issue.message


# ---- difficulty_based: Trinity's formula --------------------------------------------------------------


class TrinityBeta:
    """Trinity-RFT's BaseBetaPREstimator._update with rho 0 (trinity/buffer/selector/
    difficulty_estimator.py), one call per step over every task: alpha <- (1 - lamb) alpha + lamb + s,
    beta <- (1 - lamb) beta + lamb + f; s, f: a group's passes and fails, 0 without one."""

    def __init__(self, n: int, lamb: float):
        self.alphas, self.betas, self.lamb = np.ones(n), np.ones(n), lamb

    def update(self, groups: dict[int, tuple[float, int]]):
        s, f = np.zeros(len(self.alphas)), np.zeros(len(self.alphas))
        for task_id, (rate, rollouts) in groups.items():
            s[task_id], f[task_id] = rate * rollouts, (1 - rate) * rollouts
        self.alphas = (1 - self.lamb) * self.alphas + self.lamb + s
        self.betas = (1 - self.lamb) * self.betas + self.lamb + f


def test_the_stored_evidence_gives_trinitys_beta_estimate_at_every_step():
    """Trinity updates every task's alpha and beta each step; here only a step's own tasks are
    written (their evidence as of their latest group) and the rest is decayed when read."""
    rng = random.Random(0)
    n, lamb = 12, 0.2
    chooser, trinity = DifficultyBased(0, 4, lamb=lamb), TrinityBeta(n, lamb)
    stats: dict[int, TaskStats] = {}
    for step in range(30):
        for task_id in range(n):  # as a selection at this step reads them
            alpha, beta = chooser.beta(stats.get(task_id), step)
            assert (alpha, beta) == pytest.approx((trinity.alphas[task_id], trinity.betas[task_id]), rel=1e-12)
        groups = {task_id: (rng.choice([0.0, 0.25, 0.5, 1.0]), rng.choice([4, 8]))
                  for task_id in rng.sample(range(n), 4)}
        picked = [TaskKey(task_id, 0.0, 1, stats.get(task_id)) for task_id in groups]
        learned, _ = chooser.learn(picked, groups, step)
        stats |= learned
        trinity.update(groups)


def test_a_group_is_read_as_a_pass_rate_in_0_to_1():
    assert pass_rate([1.0, 0.0, 1.0, 0.0]) == 0.5
    assert pass_rate([1.2, -0.5, None, 0.5]) == pytest.approx(0.375)  # each reward clipped into [0, 1]


# ---- difficulty_based: what it draws ------------------------------------------------------------------


def seen(rates: dict[int, float], rollouts: int = 8, step: int = 0) -> dict[int, TaskStats]:
    """Stats of tasks with one group each at `step`, passing at these rates."""
    return {i: TaskStats(rate * rollouts, (1 - rate) * rollouts, step, int(rate == 1.0)) for i, rate in rates.items()}


def test_tasks_never_drawn_come_first_in_the_default_order():
    drawn = dict.fromkeys(range(4), 1)
    tasks = keys(10, draws=drawn, stats=seen({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}))
    picked = selector("difficulty_based", 4).select(tasks, 1)
    assert ids(picked) == ids(first_tasks(tasks[4:], 0, 4))


def test_then_the_tasks_whose_pass_rate_is_nearest_the_target():
    rates = {0: 0.0, 1: 1.0, 2: 0.5, 3: 0.375, 4: 0.875, 5: 0.125, 6: 0.625}
    tasks = keys(7, draws=dict.fromkeys(range(7), 1), stats=seen(rates))
    greedy = selector("difficulty_based", 3, do_sample=False)
    # Beta means 0.5, then 0.4 and 0.6 (a tie: the default order), of 0.5, 0.375 and 0.625 in 8.
    assert ids(greedy.select(tasks, 1)) == [2, *ids(first_tasks([tasks[3], tasks[6]], 0, 2))]
    assert set(ids(selector("difficulty_based", 2, do_sample=False, target_reward=0.9).select(tasks, 1))) == {1, 4}


def test_ties_are_broken_in_the_default_order():
    tasks = keys(8, draws=dict.fromkeys(range(8), 2), stats=seen(dict.fromkeys(range(8), 0.0)), priority={5: 1.0})
    picked = selector("difficulty_based", 3, do_sample=False).select(tasks, 1)
    assert ids(picked) == ids(first_tasks(tasks, 0, 3)) and ids(picked)[0] == 5  # priority first, then the shuffle


def test_thompson_sampling_is_seeded_by_the_run_and_the_step():
    tasks = keys(40, draws=dict.fromkeys(range(40), 1), stats=seen({i: (i % 9) / 8 for i in range(40)}))
    chooser = selector("difficulty_based", 8)
    assert ids(chooser.select(tasks, 3)) == ids(selector("difficulty_based", 8).select(copy.deepcopy(tasks), 3))
    assert ids(chooser.select(tasks, 3)) != ids(chooser.select(tasks, 4))  # a fresh draw each step
    assert ids(chooser.select(tasks, 3)) != ids(selector("difficulty_based", 8, seed=1).select(tasks, 3))


def test_with_tau_the_picks_follow_the_softmax_of_the_scores():
    """Trinity samples softmax(-|target - p| / tau) without replacement (get_indices); one pick a
    step, over many steps, lands on each task that often."""
    rates = {0: 0.5, 1: 0.25, 2: 0.0}
    tasks = keys(3, draws=dict.fromkeys(range(3), 1), stats=seen(rates, rollouts=10**6))  # estimates = rates
    chooser = selector("difficulty_based", 1, do_sample=False, tau=0.25, lamb=0.0)  # no evidence forgotten
    counts = [0, 0, 0]
    for step in range(4000):
        counts[chooser.select(tasks, step)[0].id] += 1
    weights = [math.exp(-abs(0.5 - rate) / 0.25) for rate in rates.values()]
    expected = [w / sum(weights) for w in weights]  # 0.67, 0.24, 0.09
    assert [c / 4000 for c in counts] == pytest.approx(expected, abs=0.03)


def test_fewer_tasks_than_a_batch_are_each_drawn_once():
    tasks = keys(3, draws={0: 1}, stats=seen({0: 0.5}))
    assert sorted(ids(selector("difficulty_based", 8).select(tasks, 1))) == [0, 1, 2]


def test_a_task_solved_every_time_is_retired_and_fills_the_batch_when_nothing_else_is_left():
    chooser = selector("difficulty_based", 2, retire_after=2)
    solved = TaskStats(16.0, 0.0, 4, solved_streak=2)
    tasks = keys(4, draws=dict.fromkeys(range(4), 3), stats={0: solved, 1: solved} | seen({2: 1.0, 3: 0.0}, step=4))
    assert ids(chooser.select(tasks, 5)) == ids(first_tasks(tasks[2:], 0, 2))  # 0.9 and 0.1 away, but not retired
    only_solved = tasks[:2] + [tasks[2]]
    picked = chooser.select(only_solved, 5)
    assert ids(picked)[0] == 2 and ids(picked)[1] in (0, 1)  # a retired task fills the batch
    learned, metrics = chooser.learn(picked, {2: (1.0, 8), ids(picked)[1]: (0.5, 8)}, 5)
    assert learned[2].solved_streak == 2  # task 2: its second solved group retires it
    assert learned[ids(picked)[1]].solved_streak == 0  # failed once: back in the running
    assert metrics["selector/retired_drawn"] == 1


def test_without_retire_after_nothing_is_retired():
    tasks = keys(2, draws={0: 5, 1: 5}, stats={0: TaskStats(40.0, 0.0, 4, solved_streak=5)} | seen({1: 0.5}, step=4))
    assert sorted(ids(selector("difficulty_based", 2).select(tasks, 5))) == [0, 1]


def test_what_a_step_teaches_and_its_metrics():
    chooser = selector("difficulty_based", 3, lamb=0.5)
    picked = [TaskKey(0, 0.0, 0), TaskKey(1, 0.0, 2, TaskStats(3.0, 1.0, 1)), TaskKey(2, 0.0, 1)]
    learned, metrics = chooser.learn(picked, {0: (0.25, 4), 1: (1.0, 4)}, 3)  # task 2 failed: no group
    assert learned == {0: TaskStats(1.0, 3.0, 3, 0), 1: TaskStats(3.0 * 0.25 + 4, 1.0 * 0.25, 3, 1)}
    # Estimates as of the step's start, of the tasks drawn before: task 1 Beta(1 + 1.5, 1 + 0.5), task 2 Beta(1, 1).
    assert metrics == {"selector/unseen": 1, "selector/retired_drawn": 0,
                       "selector/estimated_pass_rate": pytest.approx((2.5 / 4 + 0.5) / 2),
                       "selector/target_gap": pytest.approx((0.25 + 0.5) / 2)}


# ---- in the explorer ----------------------------------------------------------------------------------


class KnownRates:
    """Stands in for the rollout engine and the reward: rollout i of task t passes when i / n is
    below the task's rate (metadata.rate), so each group passes at exactly that rate."""

    engine = SimpleNamespace(model_version=0)

    def run_batch(self, tasks, params, explorer_step, failed=None):
        return [
            Experience(task_id=task.id, group_id=f"{explorer_step}-{task.id}", rollout_index=i, prompt_ids=[1],
                       response_ids=[2], action_mask=[1], reward=float(i / params.n < task.metadata["rate"]),
                       explorer_step=explorer_step)
            for task in tasks for i in range(params.n)
        ]


RATES = [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]


def rated_tasks(n: int) -> list[Task]:
    return [Task(i, f"q{i}", metadata={"rate": RATES[i % len(RATES)]}) for i in range(n)]


def explorer(selector_spec, source, batch_size=6, **algorithm) -> Explorer:
    config = make_config(explorer={"batch_size": batch_size}, algorithm={"repeat_times": 8, **algorithm},
                         buffer={"task_selector": selector_spec})
    return Explorer(config, KnownRates(), source, InMemoryBuffer(config), metrics=InMemoryMetrics())


def gaps(explorer_: Explorer, steps: range) -> float:
    """Mean |rate - 0.5| of the tasks drawn at those steps."""
    drawn = [e for e in explorer_.buffer.all() if e.explorer_step in steps and e.rollout_index == 0]
    return sum(abs(RATES[e.task_id % len(RATES)] - 0.5) for e in drawn) / len(drawn)


def test_the_explorer_draws_tasks_near_the_target_once_it_has_seen_them():
    runs = {}
    for name in ("default", "difficulty_based"):
        runs[name] = explore = explorer(name, InMemoryTaskSource(rated_tasks(36)))
        for _ in range(18):
            explore.explore_step()
    # Steps 0-5 draw every task once (never drawn: the default order), then the selector chooses.
    assert gaps(runs["difficulty_based"], range(6)) == gaps(runs["default"], range(6))
    # default: every rate alike (0.28); the selector draws 0.5 most, then 0.375 and 0.625 (0.17: a
    # Thompson draw from a group or two of evidence, 8 rollouts each, is wide).
    assert gaps(runs["difficulty_based"], range(6, 18)) < gaps(runs["default"], range(6, 18)) - 0.08
    flat = {name: [m["advantage/zero_variance_groups"] for (role, step), m in run.metrics.points.items()
                   if step > 6] for name, run in runs.items()}
    assert sum(flat["difficulty_based"]) < sum(flat["default"]) / 2  # fewer groups that teach nothing
    metrics = runs["difficulty_based"].metrics.points[("explorer", 18)]
    assert metrics["selector/unseen"] == 0 and metrics["selector/target_gap"] < 0.2
    assert {key for key in runs["default"].metrics.points[("explorer", 18)] if key.startswith("selector/")} == set()


def test_a_replayed_step_picks_what_the_step_picked():
    """A resumed run replays a step from what the run stored as of its start: a copy of the task
    source at that moment, in a new explorer, picks the same batch."""
    source = InMemoryTaskSource(rated_tasks(20))
    first = explorer("difficulty_based", source, batch_size=4)
    for step in range(8):
        before = InMemoryTaskSource(source.tasks())  # its tasks, draws and stats at the step's start
        first.explore_step()
        picked = {e.task_id for e in first.buffer.all() if e.explorer_step == step}
        again = explorer("difficulty_based", before, batch_size=4)
        again.step = step
        assert set(ids(again.select_tasks())) == picked, step


def test_the_explorer_stores_what_it_learned_with_the_draws():
    source = InMemoryTaskSource(rated_tasks(3))
    explore = explorer({"name": "difficulty_based", "retire_after": 1}, source, batch_size=3)
    explore.explore_step()
    stats = {task.id: task.stats for task in source.tasks()}
    assert stats == {0: TaskStats(0.0, 8.0, 0, 0), 1: TaskStats(1.0, 7.0, 0, 0), 2: TaskStats(2.0, 6.0, 0, 0)}
    assert [task.times_sampled for task in source.tasks()] == [1, 1, 1]


def test_every_task_solved_still_fills_the_batch():
    source = InMemoryTaskSource([Task(i, f"q{i}", metadata={"rate": 1.0}) for i in range(3)])
    explore = explorer({"name": "difficulty_based", "retire_after": 1}, source, batch_size=2)
    first = explore.explore_step()
    assert first["selector/retired_total"] == 2 and first["selector/retired_drawn"] == 0
    second = explore.explore_step()  # task 2, never drawn, and a retired one
    assert second["rollouts"] == 16 and second["selector/unseen"] == 1 and second["selector/retired_drawn"] == 1
    third = explore.explore_step()
    assert third["selector/retired_drawn"] == 2 and third["rollouts"] == 16
    assert [m["selector/retired_total"] for m in (first, second, third)] == [2, 3, 3]


def test_the_retired_count_is_what_the_run_stored():
    """selector/retired_total: the tasks retired now, read from the task source once the step's
    draws are recorded. A resumed run (a new explorer, its selector new) counts what was retired
    before it; a retired task's failing group puts it back."""
    source = InMemoryTaskSource([Task(i, f"q{i}", metadata={"rate": 1.0}) for i in range(3)])
    spec = {"name": "difficulty_based", "retire_after": 1}
    assert explorer(spec, source, batch_size=2).explore_step()["selector/retired_total"] == 2
    resumed = explorer(spec, source, batch_size=2)
    resumed.step = 1
    assert resumed.explore_step()["selector/retired_total"] == 3
    learned, _ = resumed.selector.learn(source.tasks_with_ids([0]), {0: (0.5, 8)}, 2)
    source.mark_sampled([0], learned)
    assert resumed.selector.totals(source) == {"selector/retired_total": 2}
    assert explorer("difficulty_based", source).selector.totals(source) == {"selector/retired_total": 0}  # none retires


def test_with_a_task_pipeline_the_selector_draws_from_what_it_leaves():
    source = InMemoryTaskSource([replace_difficulty(task) for task in rated_tasks(18)])
    config_pipeline = [{"name": "filter_difficulty", "max": 0.5}]
    config = make_config(explorer={"batch_size": 3}, algorithm={"repeat_times": 8},
                         buffer={"task_selector": "difficulty_based", "task_pipeline": config_pipeline})
    explore = Explorer(config, KnownRates(), source, InMemoryBuffer(config))
    for _ in range(6):
        explore.explore_step()
    drawn = {e.task_id for e in explore.buffer.all()}
    assert drawn and all(source.tasks_with_ids([i])[0].difficulty <= 0.5 for i in drawn)


def replace_difficulty(task: Task) -> Task:
    task.difficulty = 1.0 if task.id % 2 else 0.0
    return task
