"""Experience operators: clean, filter, dedupe, shape and promote what the explorer produced.
The algorithm's group advantage runs last, added by the explorer (see `group_advantage`)."""
from dataclasses import replace

import torch

from ..algorithms import ADVANTAGE_FNS, zero_std_mask
from ..algorithms.advantages import stepwise
from .base import EXPERIENCE_OPERATORS, pipeline_operator


def _split(experiences, keep):
    kept = [exp for exp in experiences if keep(exp)]
    return kept, {"dropped": len(experiences) - len(kept)}


@pipeline_operator(EXPERIENCE_OPERATORS, "drop_empty")
def drop_empty(experiences, ctx):
    """Responses with no text (just a stop token, or whitespace) teach nothing but to stop."""
    return _split(experiences, lambda exp: exp.response_text.strip())


@pipeline_operator(EXPERIENCE_OPERATORS, "drop_truncated")
def drop_truncated(experiences, ctx):
    """Responses cut off at max_new_tokens: their reward judges an unfinished answer."""
    return _split(experiences, lambda exp: exp.metadata.get("finish_reason") != "length")


@pipeline_operator(EXPERIENCE_OPERATORS, "reward_filter")
def reward_filter(experiences, ctx, min: float | None = None, max: float | None = None):
    lo = float("-inf") if min is None else min
    hi = float("inf") if max is None else max
    return _split(experiences, lambda exp: exp.reward is not None and lo <= exp.reward <= hi)


@pipeline_operator(EXPERIENCE_OPERATORS, "group_std_filter")
def group_std_filter(experiences, ctx):
    """Drop rollout groups whose rewards are all equal: their group advantages are all zero."""
    rollouts = [exp for exp in experiences if exp.source == "rollout"]
    if not rollouts:
        return experiences, {"dropped": 0}
    flat = zero_std_mask([exp.reward for exp in rollouts], [exp.group_id for exp in rollouts])
    dropped = {id(exp) for exp, is_flat in zip(rollouts, flat.tolist()) if is_flat}
    return _split(experiences, lambda exp: id(exp) not in dropped)


@pipeline_operator(EXPERIENCE_OPERATORS, "dedupe")
def dedupe(experiences, ctx):
    """Exact duplicates (same task, same prompt and response tokens): keep the first. The prompt
    counts: a multi-turn episode's steps (experience: step) reply to different states, and two
    turns that both said "down" were taken for one."""
    seen = set()

    def first(exp):
        key = (exp.task_id, tuple(exp.prompt_ids), tuple(exp.response_ids))
        if key in seen:
            return False
        seen.add(key)
        return True

    return _split(experiences, first)


@pipeline_operator(EXPERIENCE_OPERATORS, "reward_shaping", length_penalty={"ge": 0}, truncation_penalty={"ge": 0})
def reward_shaping(experiences, ctx, scale: float = 1.0, offset: float = 0.0, length_penalty: float = 0.0,
                   truncation_penalty: float = 0.0):
    """reward = scale * reward + offset - length_penalty * the model's tokens - truncation_penalty if cut off.

    The model's tokens are those of its action_mask: a multi-turn trajectory's environment text is
    not the model's length (a won FrozenLake episode of 170 tokens, 30 of them the model's, was
    shaped below a one-turn loss). The steps of an episode stored one by one (experience: step,
    metadata.rollout) are shaped as the episode: its model's tokens over all its steps, cut off
    if its last step was; every step keeps one reward, which stepwise advantages require.
    The reward before any shaping stays in reward_components['unshaped'] (a second run, such as a
    buffer admin's, keeps it)."""
    shaped = {}  # id of an experience -> its shaped copy
    for steps in episodes(experiences):
        penalty = length_penalty * sum(sum(exp.action_mask) for exp in steps)
        if steps[-1].metadata.get("finish_reason") == "length":
            penalty += truncation_penalty
        for exp in steps:
            unshaped = exp.reward_components.get("unshaped", exp.reward)
            shaped[id(exp)] = replace(exp, reward=scale * exp.reward + offset - penalty,
                                      reward_components={**exp.reward_components, "unshaped": unshaped})
    return [shaped[id(exp)] for exp in experiences], {}


def episodes(experiences) -> list[list]:
    """The experiences of each episode, its steps in turn order, episodes in order of first
    appearance: a multi-turn episode stored step by step (experience: step) is the steps that
    share its group and metadata.rollout; any other experience is an episode of its own."""
    found = {}
    for exp in experiences:
        key = (exp.source, exp.group_id, exp.metadata["rollout"]) if "rollout" in exp.metadata else id(exp)
        found.setdefault(key, []).append(exp)
    return [sorted(steps, key=lambda exp: exp.metadata.get("turn", 0)) for steps in found.values()]


@pipeline_operator(EXPERIENCE_OPERATORS, "promote_to_expert")
def promote_to_expert(experiences, ctx, min_reward: float = 1.0):
    """Copy rollouts scoring at least min_reward into expert data (MIX then imitates them).
    The rollouts themselves stay; the copies cite them in metadata['promoted_from']."""
    promoted = [
        replace(
            exp,
            source="expert",
            group_id=f"promoted-{exp.group_id}",
            advantage=None,
            metadata={**exp.metadata, "promoted_from": [exp.explorer_step, exp.task_id, exp.rollout_index]},
        )
        for exp in experiences
        if exp.source == "rollout" and exp.reward is not None and exp.reward >= min_reward
    ]
    return experiences + promoted, {"promoted": len(promoted)}


def group_advantage(
    experiences, ctx, fn: str = "grpo", drop_zero_std: bool = False, by_episode: bool = False, **params
):
    """The algorithm's advantage fn over the rollout groups (always the last operator).
    Other sources keep advantage None: the trainer imitates them rather than weighting them.
    `by_episode`: step experiences of multi-turn episodes (metadata.rollout names their episode)
    get one advantage per episode, from the episodes of the same task, broadcast to its steps."""
    rollouts = [exp for exp in experiences if exp.source == "rollout"]
    if not rollouts:
        return experiences, {"zero_std_groups": 0}
    rewards = torch.tensor([exp.reward for exp in rollouts], dtype=torch.float32)
    groups = [exp.group_id for exp in rollouts]
    if by_episode:
        episodes = [exp.metadata["rollout"] for exp in rollouts]
        advantages, metrics = stepwise(fn, rewards, groups, episodes, **params)
    else:
        advantages, metrics = ADVANTAGE_FNS.get(fn)(rewards, groups, **params)
    for exp, advantage in zip(rollouts, advantages.tolist()):
        exp.advantage = advantage
    if drop_zero_std:
        experiences, dropped = group_std_filter(experiences, ctx)
        metrics["zero_std_dropped"] = dropped["dropped"]
    return experiences, metrics
