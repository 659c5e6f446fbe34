"""Policy losses (registered by name), entropy and the PPO critic's value loss.

Tensors are [B, T] over response tokens with a float 0/1 mask; metrics are plain floats.
"""
import torch
import torch.nn.functional as F

from workers.rft.algorithms.aggregation import aggregate, masked_mean
from workers.rft.registry import Registry

POLICY_LOSSES = Registry("policy loss")


@POLICY_LOSSES.register("ppo")
def ppo(logprobs, old_logprobs, advantages, mask, clip_low: float, clip_high: float, agg_mode: str = "token-mean"):
    """Clipped surrogate: per token max(-A·ratio, -A·clip(ratio, 1-clip_low, 1+clip_high)).

    advantages may be [B] (one per sequence, as group fns give) or [B, T].
    clip_frac: share of kept tokens where the clipped term wins (its gradient is then 0).
    approx_kl: KL(π_old ‖ π) by the k3 estimator from π_old's samples, mean over kept tokens:
    ratio - 1 - log(ratio), never negative.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = (logprobs - old_logprobs).clamp(-20, 20)  # exp stays finite on stale data
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = aggregate(torch.maximum(unclipped, clipped), mask, agg_mode)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, metrics


@POLICY_LOSSES.register("sft")
def sft(logprobs, mask, agg_mode: str = "token-mean"):
    """Negative log-likelihood of the kept tokens."""
    loss = aggregate(-logprobs, mask, agg_mode)
    return loss, {"sft_loss": loss.item()}


@POLICY_LOSSES.register("dpo")
def dpo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float):
    """Sequence log-probs [B] -> mean of -log σ(β·((π_c - ref_c) - (π_r - ref_r))).

    dpo_margin is the mean implicit reward margin β·(...); dpo_acc the share of pairs where it is > 0.
    """
    logits = beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))
    loss = -F.logsigmoid(logits).mean()
    with torch.no_grad():
        metrics = {"dpo_acc": (logits > 0).float().mean().item(), "dpo_margin": logits.mean().item()}
    return loss, metrics


@POLICY_LOSSES.register("mix")
def mix(policy_loss, sft_loss, mu: float):
    """MIX: policy loss on usual experiences blended with SFT loss on expert ones."""
    return (1 - mu) * policy_loss + mu * sft_loss


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] -> [B, T]: entropy of the softmax at each position."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def value_loss(values, old_values, returns, mask, clip: float, agg_mode: str = "token-mean"):
    """PPO critic: 0.5·max((v - R)², (v_clipped - R)²), v_clipped = old + clip(v - old, ±clip)."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped_values - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(unclipped_err, clipped_err), mask, agg_mode)
    with torch.no_grad():
        clip_frac = masked_mean((clipped_err > unclipped_err).to(mask.dtype), mask).item()
    return loss, {"vf_loss": loss.item(), "vf_clip_frac": clip_frac}
