"""The share of groups whose rewards were all equal (`advantage/zero_variance_groups`): what a
GRPO-family step logs, so that a run training on nothing says so (docs/algorithms.md)."""
from types import SimpleNamespace

import pytest

from workers.rft.algorithms import ADVANTAGE_FNS, GROUP_ADVANTAGE_FNS, zero_variance_share
from workers.rft.experience import Experience
from workers.rft.explorer import Explorer, merge_parts, rollout_metrics
from workers.rft.memory import InMemoryBuffer, InMemoryMetrics, InMemoryTaskSource, load_tasks

from .conftest import make_config


@pytest.mark.parametrize("fn", GROUP_ADVANTAGE_FNS)
def test_every_group_advantage_fn_reports_the_share_of_compared_groups_with_equal_rewards(fn):
    # a: [1, 1] equal; b: [0, 0, 0] equal; c: [1, 0] differs; d: [3] alone (compared with nothing)
    rewards = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 3.0]
    groups = ["a", "a", "b", "b", "b", "c", "c", "d"]
    _, metrics = ADVANTAGE_FNS.get(fn)(rewards, groups)
    assert metrics["zero_std_groups"] == 2 and metrics["compared_groups"] == 3
    assert metrics["zero_variance_groups"] == pytest.approx(2 / 3)


def test_groups_of_one_are_not_compared_and_give_a_share_of_zero():
    _, metrics = ADVANTAGE_FNS.get("grpo")([1.0, 0.0, 1.0], ["a", "b", "c"])
    assert metrics == {"zero_std_groups": 0, "compared_groups": 0, "zero_variance_groups": 0.0}


class EqualRewards:
    """Stands in for the rollout engine and the reward: every rollout of task 0 scores 1, of task 1
    scores 0, of task 2 alternates 1, 0, ...: two of three groups carry no signal."""

    engine = SimpleNamespace(model_version=0)

    def run_batch(self, tasks, params, explorer_step, failed=None):
        return [
            Experience(task_id=task.id, group_id=f"{explorer_step}-{task.id}", rollout_index=i, prompt_ids=[1],
                       response_ids=[2, 3], action_mask=[1, 1], reward=float(rank == 0 or (rank == 2 and i % 2)))
            for rank, task in enumerate(tasks) for i in range(params.n)
        ]


def test_an_explorer_step_logs_the_share_of_groups_with_equal_rewards():
    config = make_config(explorer={"batch_size": 3})
    metrics = InMemoryMetrics()
    explorer = Explorer(config, EqualRewards(), InMemoryTaskSource(load_tasks(config.buffer.taskset)[:3]),
                        InMemoryBuffer(config), metrics=metrics)
    logged = explorer.explore_step()
    assert logged["advantage/zero_std_groups"] == 2 and logged["advantage/compared_groups"] == 3
    assert logged["advantage/zero_variance_groups"] == pytest.approx(2 / 3)
    assert metrics.points[("explorer", 1)]["advantage/zero_variance_groups"] == pytest.approx(2 / 3)


def test_a_shared_step_takes_the_share_of_the_summed_counts_not_the_sum_of_the_shares():
    def part(flat, compared):
        means = rollout_metrics([])
        means.pop("rollouts")
        counts = zero_variance_share({"zero_std_groups": flat, "compared_groups": compared})
        return {"rollouts": 4, "means": means, "tokens": 8, "generate_seconds": 1.0, "explorer": "e",
                "counts": {f"advantage/{key}": value for key, value in counts.items()}}

    merged = merge_parts([part(4, 4), part(0, 4), part(1, 2)])  # shares 1, 0 and 0.5
    assert merged["advantage/zero_std_groups"] == 5 and merged["advantage/compared_groups"] == 10
    assert merged["advantage/zero_variance_groups"] == 0.5


def test_counts_without_compared_groups_get_no_share():
    assert zero_variance_share({"written": 8}, prefix="advantage/") == {"written": 8}
