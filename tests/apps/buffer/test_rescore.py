"""Re-scoring stored rollouts from the admin: the annotators' rating stays, and the group
advantages a GRPO run trains on follow the new rewards on the rows no trainer step has used."""
import math

import pytest

from apps.buffer import curation
from apps.buffer.models import Experience
from apps.buffer.store import DjangoExperienceBuffer
from apps.core.jobs import run_job
from apps.runs.models import Run


def rescore(rows, reward_fn="exact_match"):
    job = curation.start_rescore(Experience.objects.filter(pk__in=[row.pk for row in rows]), reward_fn=reward_fn)
    job = run_job("buffer.bufferjob", job.pk)
    assert job.status == "succeeded", job.error
    return job.result


def values(rows, field):
    return [getattr(row, field) for row in Experience.objects.filter(pk__in=[r.pk for r in rows]).order_by("pk")]


def grpo(rewards):
    """GRPO's outcome advantage as verl computes it (verl/trainer/ppo/core_algos.py,
    compute_grpo_outcome_advantage): (r - mean) / (std + epsilon), torch.std unbiased; epsilon
    1e-6 as algorithm.epsilon's default."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


@pytest.fixture
def group(make_experience, tasks):
    """A GRPO group of four rollouts of 'What is 2 + 2?' (answer 4), all scored 0 by the explorer,
    and a rollout of another group."""
    rows = [
        make_experience(task=tasks[2], group_id="7-2", response_text=text, reward=0.0, advantage=0.0,
                        reward_components={"exact_match": 0.0})
        for text in ("4", "The answer is 4.", "5", "I do not know")
    ]
    return rows, make_experience(task=tasks[1], group_id="7-1", response_text="2", reward=0.0, advantage=0.5)


def test_rescore_keeps_the_annotators_rating_and_it_still_reaches_training(group):
    """_rescore replaced reward_components: a 5/5 rating (human 1.0) vanished from training."""
    rows, _ = group
    Experience.objects.filter(pk=rows[2].pk).update(reward_components={"exact_match": 0.0, "human": 1.0})
    Run.objects.filter(pk=rows[2].run_id).update(config={"feedback": {"reward_mode": "override"}})

    rescore(rows)

    rated = Experience.objects.get(pk=rows[2].pk)
    assert rated.reward_components == {"exact_match": 0.0, "human": 1.0} and rated.reward == 0.0
    assert rated.metadata["rescored"] == {
        "reward_fn": "exact_match", "previous_reward": 0.0, "previous_components": {"exact_match": 0.0, "human": 1.0},
        "job": rated.metadata["rescored"]["job"],
    }
    # The run overrides rewards with ratings: the trainer sees the rating, not the rescored 0.
    sampled = DjangoExperienceBuffer(rows[2].run_id).sample(4, sources=("rollout",))
    assert {e.id: e.reward for e in sampled}[rows[2].pk] == 1.0


def test_rescore_recomputes_the_groups_advantages_where_no_step_trained_on_them(group):
    """The stored advantage, what GRPO trains on, stayed 0 for all four after the rewards became 1, 1, 0, 0."""
    rows, other = group
    Experience.objects.filter(pk=rows[3].pk).update(status="consumed", advantage=0.25)  # a step trained on it

    result = rescore(rows[:2])  # only two are selected: the group's baseline moves for all four

    assert result == {"rescored": 2, "skipped_without_task": 0, "advantages_recomputed": 3,
                      "advantages_kept_as_trained": 1, "advantages_stale": 0}
    assert values(rows, "reward") == [1.0, 1.0, 0.0, 0.0]
    expected = grpo([1.0, 1.0, 0.0, 0.0])
    assert values(rows, "advantage")[:3] == pytest.approx(expected[:3])
    assert values(rows, "advantage")[3] == 0.25  # what training used stays on record
    assert values([other], "advantage") == [0.5]  # another group: untouched


def test_a_rejected_rollout_is_not_in_its_groups_baseline(group):
    rows, _ = group
    Experience.objects.filter(pk=rows[3].pk).update(status="rejected", advantage=0.0)
    assert rescore(rows[:3])["advantages_recomputed"] == 3
    assert values(rows, "advantage") == pytest.approx([*grpo([1.0, 1.0, 0.0]), 0.0])


def test_a_run_that_compares_no_groups_keeps_its_advantages(group):
    """PPO reads the rewards in the trainer (GAE): there is no group advantage to recompute."""
    rows, _ = group
    Run.objects.filter(pk=rows[0].run_id).update(config={"algorithm": {"name": "ppo"}})
    result = rescore(rows)
    assert (result["advantages_recomputed"], result["advantages_stale"]) == (0, 0)
    assert values(rows, "advantage") == [0.0] * 4


def test_an_episode_rescored_step_by_step_keeps_its_advantages_and_says_they_are_stale(make_experience, tasks):
    """Steps of one multi-turn episode share its reward; rescored each on its own text they no
    longer do, and no episode advantage can be computed from them."""
    steps = [
        make_experience(task=tasks[2], group_id="3-2", response_text=text, reward=0.0, advantage=0.1,
                        metadata={"rollout": episode})
        for text, episode in (("4", 0), ("go on", 0), ("5", 1), ("stop", 1))
    ]
    result = rescore(steps)
    assert (result["advantages_recomputed"], result["advantages_stale"]) == (0, 4)
    assert values(steps, "advantage") == [0.1] * 4
    for row in Experience.objects.filter(pk__in=[s.pk for s in steps]):
        assert "carry different rewards" in row.metadata["rescored"]["advantage_stale"]


def test_an_unreadable_run_config_leaves_the_advantages_marked_stale(group):
    rows, _ = group
    Run.objects.filter(pk=rows[0].run_id).update(config={"algorithm": {"name": "no-such-algorithm"}})
    result = rescore(rows)
    assert (result["advantages_recomputed"], result["advantages_stale"]) == (0, 4)
    stale = Experience.objects.get(pk=rows[0].pk).metadata["rescored"]["advantage_stale"]
    assert stale.startswith("the run's config no longer reads:") and "algorithm.name" in stale
