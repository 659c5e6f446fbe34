"""Advantage fns. Group fns map one scalar reward per rollout to one advantage per rollout, comparing
rollouts of the same task (same group id); `compute_gae` ('ppo') works per token with a critic.

Std is the population std (unbiased=False): it is defined for any group size, and a group whose
rewards are all equal has std exactly 0. Such a group carries no signal: its advantages are exactly
0 (tested by max == min, not by a float std that rounding may leave at 1e-9) and it is counted in
the metric 'zero_std_groups'.
"""
from collections import namedtuple
from collections.abc import Sequence

import torch

from workers.rft.registry import Registry

ADVANTAGE_FNS = Registry("advantage fn")

Groups = namedtuple("Groups", "index size mean std flat")  # per-group tensors; `index` maps rollout -> group


def group_stats(rewards: torch.Tensor, group_ids: Sequence) -> Groups:
    """Size, mean, population std and flatness (max == min) of each group of rollouts."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    positions = {}
    index = torch.tensor([positions.setdefault(g, len(positions)) for g in ids], device=rewards.device)
    zeros = torch.zeros(len(positions), dtype=rewards.dtype, device=rewards.device)
    size = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = zeros.index_add(0, index, rewards) / size
    std = (zeros.index_add(0, index, (rewards - mean[index]) ** 2) / size).sqrt()
    high = zeros.scatter_reduce(0, index, rewards, "amax", include_self=False)
    low = zeros.scatter_reduce(0, index, rewards, "amin", include_self=False)
    return Groups(index, size, mean, std, high == low)


def zero_std_mask(rewards, group_ids: Sequence) -> torch.Tensor:
    """Bool [B]: rollouts whose group has identical rewards (what drop_zero_std_groups drops)."""
    groups = group_stats(_as_float(rewards), group_ids)
    return groups.flat[groups.index]


def _as_float(rewards) -> torch.Tensor:
    rewards = torch.as_tensor(rewards).detach()
    return rewards if rewards.is_floating_point() else rewards.float()


def _metrics(groups: Groups) -> dict:
    return {"zero_std_groups": int(groups.flat.sum())}


@ADVANTAGE_FNS.register("grpo")
def grpo(rewards, group_ids: Sequence, epsilon: float = 1e-6, std_normalize: bool = True):
    """(r - group mean) / (group std + epsilon); without std_normalize just r - group mean (Dr. GRPO)."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    adv = rewards - g.mean[g.index]
    if std_normalize:
        adv = adv / (g.std[g.index] + epsilon)
    return adv.masked_fill(g.flat[g.index], 0.0), _metrics(g)


@ADVANTAGE_FNS.register("rloo")
def rloo(rewards, group_ids: Sequence):
    """r_i - mean of the other rewards of its group, i.e. n/(n-1) * (r_i - group mean); 0 for a group of one."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    scale = g.size / (g.size - 1).clamp(min=1)
    adv = scale[g.index] * (rewards - g.mean[g.index])
    return adv.masked_fill(g.flat[g.index], 0.0), _metrics(g)


@ADVANTAGE_FNS.register("reinforce_plus_plus")
def reinforce_plus_plus(rewards, group_ids: Sequence, epsilon: float = 1e-6):
    """r - group mean, then whitened over the whole batch: (a - mean) / (std + epsilon)."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    adv = (rewards - g.mean[g.index]).masked_fill(g.flat[g.index], 0.0)
    adv = (adv - adv.mean()) / (adv.std(unbiased=False) + epsilon)
    return adv, _metrics(g)


@ADVANTAGE_FNS.register("ppo")
@torch.no_grad()
def compute_gae(token_rewards, values, mask, gamma: float, lam: float, whiten: bool = True):
    """GAE(gamma, lam) per token -> (advantages [B,T], returns [B,T]), both 0 where mask is 0.

    Masked tokens (environment turns in a multi-turn rollout) are skipped: the recursion carries
    the next kept token's value and advantage across them. returns = advantages + values is the
    critic's target, taken before the advantages are whitened (mean 0, std 1 over kept tokens).
    """
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        kept = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = delta + gamma * lam * next_adv
        next_value = kept * values[:, t] + (1 - kept) * next_value
        next_adv = kept * advantages[:, t] + (1 - kept) * next_adv
    returns = (advantages + values) * mask
    if whiten:
        n = mask.sum().clamp(min=1)
        mean = (advantages * mask).sum() / n
        var = (((advantages - mean) * mask) ** 2).sum() / n
        advantages = (advantages - mean) * torch.rsqrt(var + 1e-8)
    return advantages * mask, returns


def stepwise(fn: str, rewards, group_ids: Sequence, episode_ids: Sequence, **params):
    """Advantages for multi-turn rollouts stored one experience per step.

    Every step of an episode carries the episode's final reward. Rollouts of a task (one group)
    are compared once per *episode*, so a long episode does not count more than a short one; each
    step then gets its episode's advantage. `episode_ids` tell the episodes apart within a group.
    """
    rewards = _as_float(rewards)
    keys = list(zip(group_ids, episode_ids))
    first = {}
    for i, key in enumerate(keys):
        if key in first and rewards[first[key]] != rewards[i]:
            raise ValueError(
                f"episode {key}: its steps carry different rewards ({rewards[first[key]]} and {rewards[i]})"
            )
        first.setdefault(key, i)
    episodes = list(first)
    advantages, metrics = ADVANTAGE_FNS.get(fn)(
        rewards[[first[key] for key in episodes]], [g for g, _ in episodes], **params
    )
    position = {key: j for j, key in enumerate(episodes)}
    return advantages[[position[key] for key in keys]], metrics
