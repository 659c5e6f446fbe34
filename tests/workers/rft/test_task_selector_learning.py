"""The difficulty selector does what it names, end to end: the tiny model's own rollouts on the
addition taskset, through the loop, the rollout engine and a reward fn, and the selector learns
each task's pass rate from them and draws the tasks that pass about half the time: the groups
with reward variance, which GRPO learns from.

The reward makes each task's pass rate known whatever the model writes: a response passes when a
hash of it, mod 10, is below the task's first operand a (0 to 9), so a task passes about a/10 of
its rollouts (the tiny model's 320 answers of a 5-step run were 320 distinct texts, their hashes
mod 10 spread 24 to 38 to a digit). Nothing is trained (mode explore): the pass rates stay put,
and what the selector draws is the only difference between the runs."""
import zlib

import pytest

from workers.rft.config import RunConfig
from workers.rft.loop import Loop
from workers.rft.memory import memory_stores
from workers.rft.rewards import REWARD_FNS
from workers.rft.task_selectors import pass_rate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("data_dir")]

HASH_BELOW_A = "test_hash_below_a"
FIRST_EPOCH = 5  # 40 tasks, 8 a step: every task is drawn once before the selector may choose
STEPS = 20


@pytest.fixture(scope="module")
def hash_below_a():
    def hash_below_a(response: str, task) -> float:
        """1 when crc32(response) mod 10 is below the task's first operand."""
        return float(zlib.crc32(response.encode()) % 10 < task.metadata["a"])

    hash_below_a.rules = {}  # what reward_fn() would set: no parameters
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(REWARD_FNS._entries, HASH_BELOW_A, hash_below_a)
        yield HASH_BELOW_A


def explore(tmp_path, selector) -> dict:
    config = RunConfig.from_dict({
        "seed": 0, "mode": "explore", "model": {"path": "tiny"}, "algorithm": {"repeat_times": 8},
        "explorer": {"batch_size": 8, "max_new_tokens": 4, "use_chat_template": False, "reward_fn": HASH_BELOW_A},
        "trainer": {"total_steps": STEPS},  # mode explore: explorer steps
        "buffer": {"taskset": "arithmetic:n=40,max_operand=9,ops=+", "task_selector": selector},
    })
    stores = memory_stores(config)
    assert Loop(config, stores, tmp_path / str(zlib.crc32(repr(selector).encode()))).run() == "completed"
    groups = {}
    for e in stores.buffer.all():
        groups.setdefault((e.explorer_step, e.task_id), []).append(e.reward)
    after = [pass_rate(rewards) for (step, _), rewards in groups.items() if step >= FIRST_EPOCH]
    a = {task.id: task.metadata["a"] for task in stores.task_source.tasks()}
    drawn = [a[task] / 10 for (step, task) in groups if step >= FIRST_EPOCH]
    zero_variance = [m["advantage/zero_variance_groups"] for (role, step), m in stores.metrics.points.items()
                     if role == "explorer" and step > FIRST_EPOCH]
    return {
        "gap": sum(abs(rate - 0.5) for rate in after) / len(after),  # the drawn groups' distance from 0.5
        "true_gap": sum(abs(rate - 0.5) for rate in drawn) / len(drawn),  # ... of their tasks' pass rates
        "zero_variance": sum(zero_variance) / len(zero_variance),
        "metrics": stores.metrics.points[("explorer", STEPS)],
        "first_epoch": sorted(task for (step, task) in groups if step < FIRST_EPOCH),
    }


# Measured (seed 0, 20 steps): of the tasks drawn after the first epoch, the mean distance of their
# pass rate a/10 from 0.5 went 0.225 (default order) -> 0.15 (0.125 with lamb 0.01); of their
# groups' observed pass rates, 0.268 -> 0.179 (8 rollouts: a task passing at 0.5 is observed 0.14
# away on average); the share of groups with equal rewards 0.13 -> 0.06.


def test_the_difficulty_selector_draws_the_tasks_that_pass_about_half_the_time(tmp_path, hash_below_a):
    default, learned = explore(tmp_path, "default"), explore(tmp_path, "difficulty_based")
    print(f"\nafter the first epoch: mean |pass rate - 0.5| {default['gap']:.3f} (default order) -> "
          f"{learned['gap']:.3f}, of the tasks' a/10 {default['true_gap']:.3f} -> {learned['true_gap']:.3f}; "
          f"groups of equal rewards {default['zero_variance']:.2f} -> {learned['zero_variance']:.2f}")
    assert default["first_epoch"] == learned["first_epoch"] == list(range(40))  # each task once, alike
    assert learned["true_gap"] < min(0.17, default["true_gap"] - 0.06)
    assert learned["gap"] < default["gap"] - 0.06
    assert learned["zero_variance"] < 0.6 * default["zero_variance"]
    # What the run page shows of it: the drawn tasks' estimates, near 0.5.
    assert abs(learned["metrics"]["selector/estimated_pass_rate"] - 0.5) < 0.15
    assert "selector/estimated_pass_rate" not in default["metrics"]
