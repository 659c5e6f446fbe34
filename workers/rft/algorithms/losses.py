"""Policy losses (registered by name), entropy and the PPO critic's value loss.

Every policy loss has one signature, and the trainer calls the run's (`resolve(config).policy_loss`)
on every micro-batch:

    loss_fn(logprobs, inputs: LossInputs, algo) -> (loss, metrics)

`logprobs` [B, T] are the policy's log-probs of the micro-batch's response tokens (with gradient);
`inputs` carries everything else the loss may read, and which part of the trainer batch the rows
are (`USUAL` rollouts, `EXPERT` data, or DPO `PAIRS`); `algo` is the run's AlgorithmConfig. A loss
refuses a part it has no meaning for. Tensors are [B, T] over response tokens with a float 0/1
mask; metrics are plain floats.

The regularisers sit with the losses that use them: the KL penalty to the reference and the
entropy bonus apply to the rollouts' policy-gradient term (ppo, and mix's usual part); sft has the
entropy bonus; dpo has its reference in the loss itself and neither regulariser (config.py refuses
the keys there).
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.rft.algorithms.aggregation import aggregate, masked_mean
from workers.rft.algorithms.kl import KL_FNS
from workers.rft.registry import Registry

POLICY_LOSSES = Registry("policy loss")

USUAL, EXPERT, PAIRS = "usual", "expert", "pairs"  # the parts of a trainer batch


@dataclass
class LossInputs:
    """What a policy loss reads besides the policy's log-probs. A loss reads only what its part has."""

    mask: torch.Tensor  # [B, T] float: 1 on the tokens the loss covers
    part: str = USUAL  # USUAL rollouts (rewarded), EXPERT data (imitated), or PAIRS (DPO)
    old_logprobs: torch.Tensor | None = None  # [B, T] the behaviour policy's (USUAL)
    advantages: torch.Tensor | None = None  # [B] one per rollout (group fns) or [B, T] (GAE) (USUAL)
    # [B, T] the reference model's: PAIRS always; USUAL when algorithm.kl.fn is not 'none'.
    ref_logprobs: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # [B, T, V] the policy's, for the entropy bonus and metric


def _needs(name: str, inputs: LossInputs, parts: tuple[str, ...]) -> None:
    if inputs.part not in parts:
        raise ValueError(f"policy loss '{name}' trains on {' or '.join(parts)} rows, not on {inputs.part} rows")


@POLICY_LOSSES.register("ppo")
def ppo(logprobs, inputs: LossInputs, algo):
    """Clipped surrogate on rollouts: per token max(-A·ratio, -A·clip(ratio, 1-clip_low, 1+clip_high)),
    plus the KL penalty and entropy bonus.

    clip_frac: share of kept tokens where the clipped term wins (its gradient is then 0).
    approx_kl: KL(π_old ‖ π) by the k3 estimator from π_old's samples, mean over kept tokens:
    ratio - 1 - log(ratio), never negative. policy_loss: the surrogate alone.
    """
    _needs("ppo", inputs, (USUAL,))
    mask, advantages = inputs.mask, inputs.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = (logprobs - inputs.old_logprobs).clamp(-20, 20)  # exp stays finite on stale data
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high)
    loss = aggregate(torch.maximum(unclipped, clipped), mask, algo.loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "policy_loss": loss.item(),
            "clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    loss = _kl_penalty(loss, metrics, logprobs, inputs, algo)
    return _entropy_bonus(loss, metrics, inputs, algo)


@POLICY_LOSSES.register("sft")
def sft(logprobs, inputs: LossInputs, algo):
    """Negative log-likelihood of the kept tokens of expert data, plus the entropy bonus. It reads
    no reward, so it has no meaning on rollouts (config.py refuses it on RL algorithms)."""
    _needs("sft", inputs, (EXPERT,))
    loss = _nll(logprobs, inputs, algo)
    return _entropy_bonus(loss, {"sft_loss": loss.item()}, inputs, algo)


@POLICY_LOSSES.register("mix")
def mix(logprobs, inputs: LossInputs, algo):
    """MIX: (1 - mu)·ppo on the usual rollouts and mu·NLL on the expert data of the same batch.
    The two parts' losses add up to the batch's; metrics report each term unweighted (the entropy
    is the rollouts' alone, so one number does not mix both)."""
    _needs("mix", inputs, (USUAL, EXPERT))
    mu = algo.mix.mu
    if inputs.part == EXPERT:
        loss = _nll(logprobs, inputs, algo)
        return mu * loss, {"sft_loss": loss.item()}
    loss, metrics = ppo(logprobs, inputs, algo)
    return (1 - mu) * loss, metrics


@POLICY_LOSSES.register("dpo")
def dpo(logprobs, inputs: LossInputs, algo):
    """Preference pairs: the first half of the rows are the chosen responses, the second half the
    rejected ones (pair i is rows i and i + B/2), with the reference's log-probs. On sequence
    log-probs: mean over pairs of -log σ(β·((π_c - ref_c) - (π_r - ref_r))).

    dpo_margin is the mean implicit reward margin β·(...); dpo_acc the share of pairs where it is > 0.
    """
    _needs("dpo", inputs, (PAIRS,))
    policy = (logprobs * inputs.mask).sum(-1)
    reference = (inputs.ref_logprobs * inputs.mask).sum(-1)
    (chosen, rejected), (ref_chosen, ref_rejected) = policy.chunk(2), reference.chunk(2)
    logits = algo.dpo.beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    loss = -F.logsigmoid(logits).mean()
    with torch.no_grad():
        metrics = {"dpo_acc": (logits > 0).float().mean().item(), "dpo_margin": logits.mean().item()}
    return loss, metrics


def _nll(logprobs, inputs: LossInputs, algo) -> torch.Tensor:
    return aggregate(-logprobs, inputs.mask, algo.loss_agg_mode)


def _kl_penalty(loss, metrics: dict, logprobs, inputs: LossInputs, algo):
    """+ kl.coef · KL(π ‖ ref), estimated from the policy's own samples (the rollouts)."""
    if algo.kl.fn == "none":
        return loss
    kl = aggregate(KL_FNS.get(algo.kl.fn)(logprobs, inputs.ref_logprobs), inputs.mask, algo.loss_agg_mode)
    metrics["kl"] = kl.item()
    return loss + algo.kl.coef * kl


def _entropy_bonus(loss, metrics: dict, inputs: LossInputs, algo):
    """- entropy_coef · entropy of the policy (logged as 'entropy' either way; no gradient at coef 0)."""
    if inputs.logits is None:
        return loss, metrics
    coef = algo.entropy_coef
    with torch.set_grad_enabled(coef != 0 and torch.is_grad_enabled()):
        entropy = aggregate(entropy_from_logits(inputs.logits), inputs.mask, algo.loss_agg_mode)
    metrics["entropy"] = entropy.item()
    return loss - coef * entropy, metrics


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
