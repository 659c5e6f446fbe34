"""Advantage fns, as verl's core_algos.py and Trinity-RFT's advantage_fn/ compute them.

Group fns (GROUP_ADVANTAGE_FNS: the explorer applies them) map one scalar reward per rollout to
one advantage per rollout, comparing rollouts of the same task (same group id). A group of one is
compared with nothing: its mean is 0 and its std 1, so it keeps its reward (verl, Trinity). A
group of two or more whose rewards are all equal carries no signal: its advantages are exactly 0
(tested by max == min, not by a float std that rounding may leave at 1e-17) and it is counted in
the metric 'zero_std_groups'; 'zero_variance_groups' is their share of the groups compared
('compared_groups', those of two or more): near 1, the step trains on almost nothing.

Token fns (TOKEN_ADVANTAGE_FNS: the trainer applies them) read the rewards placed on each
rollout's last model token (`last_token_rewards`): GAE with the critic ('ppo') and REINFORCE++'s
discounted returns. The fns in WHITENED_ADVANTAGE_FNS are then whitened over the whole trainer
batch, every kept token counted (`whiten`, verl's masked_whiten), not per micro-batch.
"""
from collections import namedtuple
from collections.abc import Callable, Sequence

import torch

from workers.rft.registry import Registry

ADVANTAGE_FNS = Registry("advantage fn")
GROUP_ADVANTAGE_FNS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opmd")
TOKEN_ADVANTAGE_FNS = ("ppo", "reinforce_plus_plus")
WHITENED_ADVANTAGE_FNS = ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")

Groups = namedtuple("Groups", "index size mean flat rewards")  # per-group tensors; `index` maps rollout -> group


def group_stats(rewards: torch.Tensor, group_ids: Sequence) -> Groups:
    """Size, mean (0 for a group of one) and flatness (max == min, two or more members) of each group."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    positions = {}
    index = torch.tensor([positions.setdefault(g, len(positions)) for g in ids], device=rewards.device)
    zeros = torch.zeros(len(positions), dtype=rewards.dtype, device=rewards.device)
    size = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = torch.where(size > 1, zeros.index_add(0, index, rewards) / size, 0.0)
    high = zeros.scatter_reduce(0, index, rewards, "amax", include_self=False)
    low = zeros.scatter_reduce(0, index, rewards, "amin", include_self=False)
    return Groups(index, size, mean, (high == low) & (size > 1), rewards)


def group_std(g: Groups, unbiased: bool = True) -> torch.Tensor:
    """Each group's std (torch.std's n - 1 when unbiased, else n); 1 for a group of one."""
    squares = torch.zeros_like(g.mean).index_add(0, g.index, (g.rewards - g.mean[g.index]) ** 2)
    n = g.size - 1 if unbiased else g.size
    return torch.where(g.size > 1, (squares / n.clamp(min=1)).sqrt(), 1.0)


def zero_std_mask(rewards, group_ids: Sequence) -> torch.Tensor:
    """Bool [B]: rollouts whose group (two or more) has identical rewards (what drop_zero_std_groups drops)."""
    groups = group_stats(_as_float(rewards), group_ids)
    return groups.flat[groups.index]


def _as_float(rewards) -> torch.Tensor:
    rewards = torch.as_tensor(rewards).detach()
    return rewards if rewards.is_floating_point() else rewards.float()


def _metrics(groups: Groups) -> dict:
    counts = {"zero_std_groups": int(groups.flat.sum()), "compared_groups": int((groups.size > 1).sum())}
    return zero_variance_share(counts)


def zero_variance_share(counts: dict, prefix: str = "") -> dict:
    """The counts with `zero_variance_groups`, the share of compared groups whose rewards were all
    equal (0 with none compared), from `zero_std_groups` and `compared_groups` under `prefix`: the
    explorer sums its explorers' counts (explorer.merge_parts), then takes the share of the sums.
    Counts without `compared_groups` come back as they are."""
    if prefix + "compared_groups" not in counts:
        return counts  # no group advantage this step (ppo, sft, dpo...): no share to report
    compared = counts[prefix + "compared_groups"]
    share = counts.get(prefix + "zero_std_groups", 0) / compared if compared else 0.0
    return {**counts, prefix + "zero_variance_groups": share}


@ADVANTAGE_FNS.register("grpo")
def grpo(rewards, group_ids: Sequence, epsilon: float = 1e-6, std_normalize: bool = True, std_unbiased: bool = True):
    """(r - group mean) / (group std + epsilon), the std unbiased as torch.std (verl's
    compute_grpo_outcome_advantage, Trinity's GRPOAdvantageFn); std_unbiased False: the population
    std. Without std_normalize just r - group mean (Dr. GRPO)."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    adv = rewards - g.mean[g.index]
    if std_normalize:
        adv = adv / (group_std(g, std_unbiased)[g.index] + epsilon)
    return adv.masked_fill(g.flat[g.index], 0.0), _metrics(g)


@ADVANTAGE_FNS.register("rloo")
def rloo(rewards, group_ids: Sequence):
    """r_i - mean of the other rewards of its group, i.e. n/(n-1) * (r_i - group mean) (verl's
    compute_rloo_outcome_advantage); a group of one keeps its reward."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    scale = g.size / (g.size - 1).clamp(min=1)  # 1 for a group of one, whose mean is 0
    adv = scale[g.index] * (rewards - g.mean[g.index])
    return adv.masked_fill(g.flat[g.index], 0.0), _metrics(g)


@ADVANTAGE_FNS.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(rewards, group_ids: Sequence):
    """r - group mean; the trainer then whitens over the whole batch's tokens (verl's
    compute_reinforce_plus_plus_baseline_outcome_advantage is both steps at once)."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    return (rewards - g.mean[g.index]).masked_fill(g.flat[g.index], 0.0), _metrics(g)


@ADVANTAGE_FNS.register("opmd")
def opmd(rewards, group_ids: Sequence, baseline: str = "mean", tau: float = 1.0):
    """r - the group's baseline: its mean, or tau * log(mean(exp(r / tau))) ('logavgexp'); a group of
    one has baseline 0, so its advantage is its reward (Trinity's OPMDAdvantageFn)."""
    rewards = _as_float(rewards)
    g = group_stats(rewards, group_ids)
    if baseline == "logavgexp":
        # logavgexp(x) = logsumexp(x) - log n, per group: shifted by the group max so exp stays finite.
        high = torch.zeros_like(g.mean).scatter_reduce(0, g.index, rewards / tau, "amax", include_self=False)
        sums = torch.zeros_like(g.mean).index_add(0, g.index, (rewards / tau - high[g.index]).exp())
        base = torch.where(g.size > 1, tau * (high + sums.log() - g.size.log()), 0.0)
    elif baseline == "mean":
        base = g.mean
    else:
        raise ValueError(f"unknown opmd baseline '{baseline}'; known: mean, logavgexp")
    return (rewards - base[g.index]).masked_fill(g.flat[g.index], 0.0), _metrics(g)


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: each rollout's reward on the last token the model wrote (the last with mask 1;
    environment tokens inside or after a multi-turn reply have mask 0). A row without one gets none."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(dim=1)
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = rewards[rows]
    return out


@ADVANTAGE_FNS.register("ppo")
@torch.no_grad()
def compute_gae(token_rewards, values, mask, gamma: float, lam: float):
    """GAE(gamma, lam) per token -> (advantages [B,T], returns [B,T]), both 0 where mask is 0, the
    advantages not yet whitened (verl's compute_gae_advantage_return before masked_whiten).

    Masked tokens (environment turns in a multi-turn rollout) are skipped: the recursion carries
    the next kept token's value and advantage across them. returns = advantages + values is the
    critic's target.
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
    return advantages * mask, (advantages + values) * mask


@ADVANTAGE_FNS.register("reinforce_plus_plus")
@torch.no_grad()
def discounted_returns(token_rewards, mask, gamma: float):
    """REINFORCE++ (verl's compute_reinforce_plus_plus_outcome_advantage, before masked_whiten):
    the discounted sum of the rewards from each kept token on. Masked tokens are skipped, as GAE
    skips them: verl resets the sum at every masked token (written for the padding after EOS,
    where both agree), which with environment tokens inside a multi-turn reply would leave the
    model's earlier turns no return at all."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        kept = mask[:, t]
        running = kept * (token_rewards[:, t] + gamma * running) + (1 - kept) * running
        returns[:, t] = running
    return returns * mask


@torch.no_grad()
def whiten(values: list[torch.Tensor], masks: list[torch.Tensor], total: Callable | None = None,
           device: torch.device | None = None) -> list[torch.Tensor]:
    """verl_F.masked_whiten(values, mask) * mask over several micro-batches as over their
    concatenation: (v - mean) / sqrt(var + 1e-8) with the mean and the unbiased variance of every
    kept token. `total` sums a tensor over the trainer's ranks (the batch is spread over them; a
    rank with no micro-batch still takes part, on `device`). With one kept token or none there is
    no spread to whiten by: zeros."""
    total = total or (lambda t: t)
    zero = torch.zeros((), dtype=torch.float64, device=values[0].device if values else device)
    count = total(sum((m.sum().double() for m in masks), zero))
    # verl's masked_mean divides by mask.sum() + 1e-8: kept, so the figures are the same to 1e-12.
    mean = total(sum(((v.double() * m).sum() for v, m in zip(values, masks)), zero)) / (count + 1e-8)
    squares = total(sum(((((v.double() - mean) ** 2) * m).sum() for v, m in zip(values, masks)), zero))
    if count.item() <= 1:
        return [torch.zeros_like(v) for v in values]
    var = squares / (count + 1e-8) * count / (count - 1)
    return [((v.double() - mean) * torch.rsqrt(var + 1e-8)).to(v.dtype) * m for v, m in zip(values, masks)]


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
