"""Human feedback in the engine's sampling: rewards under each feedback mode, group advantages
recomputed from them, and the config keys that set it up."""
import pytest
import torch

from workers.rft.algorithms import group_advantage, grpo, rloo
from workers.rft.config import ConfigError, RunConfig
from workers.rft.experience import Experience
from workers.rft.sampling import apply_human_feedback, reward_with_feedback


def experience(id, reward, human=None, group="g"):
    components = {"exact_match": reward} | ({} if human is None else {"human": human})
    return Experience(1, group, id, [1], [2], [1], reward=reward, reward_components=components, advantage=0.123, id=id)


def config(algorithm="grpo", **feedback):
    return RunConfig.from_dict({"algorithm": {"name": algorithm, "repeat_times": 4}, "feedback": feedback})


@pytest.mark.parametrize(
    "mode, weight, expected_rated, expected_unrated",
    [("none", 1.0, 1.0, 0.0), ("weight", 2.0, 1.0 + 2.0 * 0.25, 0.0), ("override", 1.0, 0.25, 0.0)],
)
def test_the_human_reward_counts_as_the_mode_says(mode, weight, expected_rated, expected_unrated):
    feedback = config(reward_mode=mode, reward_weight=weight).feedback
    assert reward_with_feedback(experience(1, 1.0, human=0.25), feedback) == pytest.approx(expected_rated)
    assert reward_with_feedback(experience(2, 0.0), feedback) == expected_unrated  # unrated: the rule reward


def test_group_advantages_are_recomputed_over_the_whole_group_from_the_new_rewards():
    # The batch holds two of the group's four rollouts; the group's advantages compare all four.
    # The unrated one counts as the group's mean rating (0.5): neither better nor worse.
    group = [
        experience(1, 0.0, human=1.0), experience(2, 0.0, human=0.0), experience(3, 0.0, human=0.5), experience(4, 0.0)
    ]
    batch = [experience(1, 0.0, human=1.0), experience(4, 0.0)]
    apply_human_feedback(batch, {"g": group}, config(reward_mode="override"))
    expected, _ = grpo(torch.tensor([1.0, 0.0, 0.5, 0.5]), ["g"] * 4, epsilon=1e-6)
    assert [e.reward for e in batch] == [1.0, 0.5]
    assert [e.advantage for e in batch] == pytest.approx([expected[0].item(), expected[3].item()])
    assert batch[0].advantage > 0 and batch[1].advantage == pytest.approx(0.0, abs=1e-6)


def test_weighted_ratings_add_to_the_rule_reward_and_unrated_rollouts_get_the_group_mean():
    group = [experience(1, 1.0, human=1.0), experience(2, 1.0, human=0.0), experience(3, 0.0)]
    apply_human_feedback(group, {"g": group}, config(reward_mode="weight", reward_weight=2.0))
    assert [e.reward for e in group] == [3.0, 1.0, 1.0]
    expected, _ = grpo(torch.tensor([3.0, 1.0, 1.0]), ["g"] * 3, epsilon=1e-6)
    assert [e.advantage for e in group] == pytest.approx(expected.tolist())


def step(id, episode, reward, human=None):
    """A step experience of a multi-turn episode (multi_turn with experience 'step')."""
    e = experience(id, reward, human)
    e.metadata = {"rollout": episode}
    return e


@pytest.mark.parametrize("mode", ["weight", "override"])
def test_step_experiences_are_rated_and_compared_episode_by_episode(mode):
    """Episode 0 of three steps (reward 1), episode 1 of one (reward 0), episode 2 of two (reward
    0). One rating on a step of episode 0 is its episode's, for all three steps (they keep one
    reward, as the explorer's stepwise advantage requires); unrated episodes take the group's mean
    rating; the group is compared once per episode, as the explorer compared it. It was compared
    step by step: a rating that moved every reward alike changed the advantages from [0.707 x3,
    -0.707] to [0.5 x3, -1.5]."""
    group = [step(1, 0, 1.0, human=0.5), step(2, 0, 1.0), step(3, 0, 1.0), step(4, 1, 0.0), step(5, 2, 0.0),
             step(6, 2, 0.0, human=0.0)]
    apply_human_feedback(group, {"g": group}, config(reward_mode=mode))
    rated = {"weight": [1.5, 0.25, 0.0], "override": [0.5, 0.25, 0.0]}[mode]  # episodes 0, 1 (mean 0.25), 2
    assert [e.reward for e in group] == pytest.approx([rated[0]] * 3 + [rated[1]] + [rated[2]] * 2)
    expected, _ = grpo(torch.tensor(rated), ["g"] * 3, epsilon=1e-6)
    by_episode = [expected[0].item()] * 3 + [expected[1].item()] + [expected[2].item()] * 2
    assert [e.advantage for e in group] == pytest.approx(by_episode)


def test_rloo_takes_its_own_parameters_and_groups_without_feedback_keep_their_advantages():
    batch = [
        experience(1, 0.0, human=1.0, group="a"),
        experience(2, 0.0, human=0.0, group="a"),
        experience(3, 1.0, group="b"),
    ]
    apply_human_feedback(batch, {"a": batch[:2]}, config("rloo", reward_mode="override"))
    expected, _ = rloo(torch.tensor([1.0, 0.0]), ["a", "a"])
    assert [e.advantage for e in batch] == pytest.approx([*expected.tolist(), 0.123])


def test_algorithms_without_group_advantages_get_only_the_rewards():
    assert group_advantage(config("grpo")) == ("grpo", {"epsilon": 1e-6, "std_normalize": True, "std_unbiased": True})
    assert group_advantage(config("ppo")) is None  # GAE reads the (new) rewards in the trainer
    batch = [experience(1, 0.0, human=0.75)]
    apply_human_feedback(batch, {"g": batch}, config("ppo", reward_mode="override"))
    assert (batch[0].reward, batch[0].advantage) == (0.75, 0.123)


@pytest.mark.parametrize(
    "feedback, key, message",
    [
        ({"scale_max": 10}, "feedback.scale_max", "<= 9"),
        ({"scale_min": 3, "scale_max": 3}, "feedback.scale_max", "greater than feedback.scale_min"),
        ({"reward_mode": "replace"}, "feedback.reward_mode", "not one of"),
        ({"rating_wait_s": -1}, "feedback.rating_wait_s", ">= 0"),
        ({"source_runs": [3, "run-4"]}, "feedback.source_runs", "item 1: expected a run id"),
        ({"rated": True}, "feedback.rated", "did you mean 'rated_only'"),
    ],
)
def test_bad_feedback_settings_are_named_by_key(feedback, key, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"feedback": feedback})
    assert [issue.key for issue in err.value.errors] == [key]
    assert message in err.value.errors[0].message
