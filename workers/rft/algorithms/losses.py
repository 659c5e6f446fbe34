"""Policy losses (registered by name), entropy and the PPO critic's value loss, as verl's
core_algos.py, Trinity-RFT's policy_loss_fn/ and TRL compute them (tests/workers/rft/
test_reference_math.py writes each reference out).

Every policy loss has one signature, and the trainer calls the run's (`resolve(config).policy_loss`)
on every micro-batch:

    loss_fn(logprobs, inputs: LossInputs, algo) -> (loss, metrics)

`logprobs` [B, T] are the policy's log-probs of the micro-batch's response tokens (with gradient);
`inputs` carries everything else the loss may read, and which part of the trainer batch the rows
are (`USUAL` rollouts, `EXPERT` data, or DPO `PAIRS`); `algo` is the run's AlgorithmConfig. A loss
refuses a part it has no meaning for; LOSS_PARTS says which parts each trains on. Tensors are
[B, T] over response tokens with a float 0/1 mask; metrics are plain floats.

The regularisers sit with the losses that use them: the KL penalty to the reference and the
entropy bonus apply to the rollouts' policy-gradient term (ppo, gspo, cispo, opmd, and the mixes'
usual part); the sft losses have the entropy bonus; dpo has its reference in the loss itself and
neither regulariser (config.py refuses the keys there). The rollout-correction weights
(correction.py) multiply the policy-gradient term per token, as verl's rollout_is_weights.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.rft.algorithms.aggregation import aggregate, masked_mean
from workers.rft.algorithms.kl import KL_FNS
from workers.rft.registry import Registry

POLICY_LOSSES = Registry("policy loss")

USUAL, EXPERT, PAIRS = "usual", "expert", "pairs"  # the parts of a trainer batch

# Metrics that are a mean over the micro-batch's tokens whatever loss_agg_mode says: the trainer
# weighs them by tokens (by sequences under a seq-mean mode, clip_frac read 0.58, 0.55 or 0.50 as
# micro_batch_size went 8, 3, 1).
TOKEN_MEANS = frozenset({"clip_frac", "clip_frac_lower", "approx_kl", "ratio_mean"})

# The parts of a trainer batch each loss trains on: it decides what the trainer samples, and
# which loss may replace an algorithm's (config.py).
LOSS_PARTS = {
    "ppo": (USUAL,), "gspo": (USUAL,), "cispo": (USUAL,), "opmd": (USUAL,),
    "mix": (USUAL, EXPERT), "mix_chord": (USUAL, EXPERT),
    "sft": (EXPERT,), "sft_is": (EXPERT,), "sft_phi": (EXPERT,),
    "dpo": (PAIRS,),
}


@dataclass
class LossInputs:
    """What a policy loss reads besides the policy's log-probs. A loss reads only what its part has."""

    mask: torch.Tensor  # [B, T] float: 1 on the tokens the loss covers
    part: str = USUAL  # USUAL rollouts (rewarded), EXPERT data (imitated), or PAIRS (DPO)
    old_logprobs: torch.Tensor | None = None  # [B, T] the behaviour policy's (USUAL)
    advantages: torch.Tensor | None = None  # [B] one per rollout (group fns) or [B, T] (token fns) (USUAL)
    # [B, T] the reference model's: PAIRS always; USUAL when algorithm.kl.fn is not 'none'.
    ref_logprobs: torch.Tensor | None = None
    # [B, T] the policy's entropy at each position, where the loss reads it (reads_entropy), with its
    # gradient when algorithm.entropy_coef > 0: for the entropy bonus and the metric.
    entropy: torch.Tensor | None = None
    # [B, T] or [B, 1]: rollout-correction weights (algorithm.rollout_correction), None: off.
    is_weights: torch.Tensor | None = None
    step: int = 0  # the trainer's step, for scheduled weights (mix_chord's mu)


def reads_entropy(loss: str, part: str) -> bool:
    """Whether `loss` on rows of `part` reads inputs.entropy: the policy-gradient term on rollouts
    (and so the mixes' rollout part) and the sft losses; not dpo, nor the mixes' expert part (its
    metric would mix two populations)."""
    return part == USUAL or LOSS_PARTS[loss] == (EXPERT,)


def _needs(name: str, inputs: LossInputs) -> None:
    parts = LOSS_PARTS[name]
    if inputs.part not in parts:
        raise ValueError(f"policy loss '{name}' trains on {' or '.join(parts)} rows, not on {inputs.part} rows")


def _agg(loss_mat, inputs: LossInputs, algo) -> torch.Tensor:
    return aggregate(loss_mat, inputs.mask, algo.loss_agg_mode, algo.loss_scale_factor)


def _token_advantages(inputs: LossInputs) -> torch.Tensor:
    advantages = inputs.advantages
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def _policy_gradient(loss_mat, metrics: dict, logprobs, inputs: LossInputs, algo, weight: float = 1.0):
    """The per-token policy-gradient loss, weighted by the rollout correction, aggregated and
    times `weight` (the mixes' 1 - mu); then the KL penalty and the entropy bonus at their own
    coefficients, as Trinity's actor adds them after its policy loss fn (dp_actor.py,
    update_policy). metrics['policy_loss']: the aggregated term alone, unweighted."""
    if inputs.is_weights is not None:
        loss_mat = loss_mat * inputs.is_weights
    loss = _agg(loss_mat, inputs, algo)
    metrics["policy_loss"] = loss.item()
    loss = _kl_penalty(weight * loss, metrics, logprobs, inputs, algo)
    return _entropy_bonus(loss, metrics, inputs, algo)


def _ratio_metrics(log_ratio, ratio, mask) -> dict:
    """approx_kl: KL(π_old ‖ π) by the k3 estimator from π_old's samples, mean over kept tokens:
    ratio - 1 - log(ratio), never negative (verl logs k1, its ppo_kl). ratio_mean: the mean ratio."""
    return {
        "approx_kl": masked_mean(ratio - 1 - log_ratio, mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
    }


@POLICY_LOSSES.register("ppo")
def ppo(logprobs, inputs: LossInputs, algo):
    """Clipped surrogate on rollouts (verl's compute_policy_loss_vanilla): per token
    max(-A·ratio, -A·clip(ratio, 1-clip_low, 1+clip_high)), and where A < 0 at most -A·clip_ratio_c
    (dual clip: a token whose ratio ran far past the clip cannot cost more than that; None: off);
    plus the KL penalty and entropy bonus.

    clip_frac: share of kept tokens where the clipped term wins (its gradient is then 0);
    clip_frac_lower: share where the dual clip bounds the loss.
    """
    _needs("ppo", inputs)
    return _policy_gradient(*_clipped_surrogate(logprobs, inputs, algo), logprobs, inputs, algo)


def _clipped_surrogate(logprobs, inputs: LossInputs, algo):
    """ppo's per-token loss and its metrics (ppo's docstring)."""
    mask, advantages = inputs.mask, _token_advantages(inputs)
    log_ratio = (logprobs - inputs.old_logprobs).clamp(-20, 20)  # exp stays finite on stale data
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item()}
    if algo.clip_ratio_c is not None:
        bound = -advantages * algo.clip_ratio_c
        lower = (loss_mat > bound) & (advantages < 0)
        metrics["clip_frac_lower"] = masked_mean(lower.to(mask.dtype), mask).item()
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, bound), loss_mat)
    with torch.no_grad():
        metrics |= _ratio_metrics(log_ratio, ratio, mask)
    return loss_mat, metrics


@POLICY_LOSSES.register("gspo")
def gspo(logprobs, inputs: LossInputs, algo):
    """GSPO (verl's compute_policy_loss_gspo): the PPO clip on one ratio per sequence, the
    geometric mean of its tokens' ratios, exp(mean log-ratio over kept tokens), with each token's
    gradient its own (sg[s]·π/sg[π]). Its paper and verl aggregate 'seq-mean-token-mean'; its clip
    ranges are ~1e3 times smaller than PPO's (3e-4 / 4e-4 in the paper)."""
    _needs("gspo", inputs)
    mask, advantages = inputs.mask, _token_advantages(inputs)
    log_ratio = logprobs - inputs.old_logprobs
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    token_log_ratio = (logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    ratio = token_log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high)
    with torch.no_grad():
        metrics = {"clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item()}
        metrics |= _ratio_metrics(log_ratio.clamp(-20, 20), log_ratio.clamp(-20, 20).exp(), mask)
    return _policy_gradient(torch.maximum(unclipped, clipped), metrics, logprobs, inputs, algo)


@POLICY_LOSSES.register("cispo")
def cispo(logprobs, inputs: LossInputs, algo):
    """CISPO (verl's compute_policy_loss_cispo): -sg(clip(ratio, 1-clip_low, 1+clip_high))·A·logπ.
    The ratio is clipped as an importance weight, not as a trust region: every token keeps its
    gradient. (Trinity's variant also drops tokens clipped in the advantage's direction.)
    clip_frac: share of kept tokens whose weight was clipped."""
    _needs("cispo", inputs)
    mask, advantages = inputs.mask, _token_advantages(inputs)
    log_ratio = (logprobs - inputs.old_logprobs).clamp(-20, 20)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high).detach()
    with torch.no_grad():
        metrics = {"clip_frac": masked_mean((ratio != weight).to(mask.dtype), mask).item()}
        metrics |= _ratio_metrics(log_ratio, ratio, mask)
    return _policy_gradient(-weight * advantages * logprobs, metrics, logprobs, inputs, algo)


@POLICY_LOSSES.register("opmd")
def opmd(logprobs, inputs: LossInputs, algo):
    """OPMD (Trinity's OPMDPolicyLossFn): -A·logπ aggregated, divided by 1 + tau (the
    regularisation towards the current policy). Reads no logπ_old."""
    _needs("opmd", inputs)
    loss_mat = -_token_advantages(inputs) * logprobs / (1.0 + algo.opmd.tau)
    return _policy_gradient(loss_mat, {}, logprobs, inputs, algo)


@POLICY_LOSSES.register("sft")
def sft(logprobs, inputs: LossInputs, algo):
    """Negative log-likelihood of the kept tokens of expert data, plus the entropy bonus. It reads
    no reward, so it has no meaning on rollouts (config.py refuses it on RL algorithms)."""
    _needs("sft", inputs)
    loss = _nll(logprobs, inputs, algo)
    return _entropy_bonus(loss, {"sft_loss": loss.item()}, inputs, algo)


@POLICY_LOSSES.register("sft_is")
def sft_is(logprobs, inputs: LossInputs, algo):
    """SFT weighted per token by the policy's own probability of it, sg(π)·(-logπ) (CHORD;
    Trinity's SFTISLossFn): tokens the policy finds unlikely weigh less."""
    _needs("sft_is", inputs)
    loss = _agg(-logprobs * logprobs.detach().exp(), inputs, algo)
    return _entropy_bonus(loss, {"sft_loss": loss.item()}, inputs, algo)


@POLICY_LOSSES.register("sft_phi")
def sft_phi(logprobs, inputs: LossInputs, algo):
    """SFT weighted per token by sg(φ(π)), φ(p) = p·(1-p) (CHORD; Trinity's SFTPhiLossFn): tokens
    the policy is sure of, either way, weigh little."""
    _needs("sft_phi", inputs)
    return _entropy_bonus(*_phi_nll(logprobs, inputs, algo), inputs, algo)


def _nll(logprobs, inputs: LossInputs, algo) -> torch.Tensor:
    return _agg(-logprobs, inputs, algo)


def _phi_nll(logprobs, inputs: LossInputs, algo):
    p = logprobs.detach().exp()
    loss = _agg(-logprobs * p * (1 - p), inputs, algo)
    return loss, {"sft_loss": loss.item()}


@POLICY_LOSSES.register("mix")
def mix(logprobs, inputs: LossInputs, algo):
    """MIX (Trinity's MIXPolicyLossFn): (1 - mu)·ppo's clipped surrogate on the usual rollouts and
    mu·NLL on the expert data of the same batch; the KL penalty and entropy bonus on the rollouts at
    their full coefficients (Trinity's actor adds them after the mix; they were scaled by 1 - mu
    here, a KL 10x weaker at mu 0.9). The two parts' losses add up to the batch's; metrics report
    each term unweighted (the entropy is the rollouts' alone, so one number does not mix both)."""
    _needs("mix", inputs)
    mu = algo.mix.mu
    if inputs.part == EXPERT:
        loss = _nll(logprobs, inputs, algo)
        return mu * loss, {"sft_loss": loss.item()}
    return _policy_gradient(*_clipped_surrogate(logprobs, inputs, algo), logprobs, inputs, algo, weight=1 - mu)


def chord_mu(step: int, chord) -> float:
    """CHORD's SFT weight at a trainer step (Trinity's mu_schedule_function): a linear warmup to
    mu_peak over mu_warmup_steps, a cosine decay to mu_valley over mu_decay_steps, then mu_valley."""
    if step < chord.mu_warmup_steps:
        return step / chord.mu_warmup_steps * chord.mu_peak
    if step >= chord.mu_warmup_steps + chord.mu_decay_steps:
        return chord.mu_valley
    cosine = 0.5 * (1 + math.cos(math.pi * (step - chord.mu_warmup_steps) / chord.mu_decay_steps))
    return (chord.mu_peak - chord.mu_valley) * cosine + chord.mu_valley


@POLICY_LOSSES.register("mix_chord")
def mix_chord(logprobs, inputs: LossInputs, algo):
    """CHORD (Trinity's MIXCHORDPolicyLossFn): as mix (KL and entropy at full coefficients), with the
    SFT weight mu scheduled by the trainer step (chord_mu) and the expert tokens weighted by φ (sft_phi; plain NLL with
    chord.enable_phi_function false). metrics['mu']: this step's weight, from the rollouts' part
    alone (the trainer sums each part's metrics over its micro-batches)."""
    _needs("mix_chord", inputs)
    mu = chord_mu(inputs.step, algo.chord)
    if inputs.part == EXPERT:
        if algo.chord.enable_phi_function:
            loss, metrics = _phi_nll(logprobs, inputs, algo)
        else:
            loss = _nll(logprobs, inputs, algo)
            metrics = {"sft_loss": loss.item()}
        return mu * loss, metrics
    loss_mat, metrics = _clipped_surrogate(logprobs, inputs, algo)
    return _policy_gradient(loss_mat, metrics | {"mu": mu}, logprobs, inputs, algo, weight=1 - mu)


@POLICY_LOSSES.register("dpo")
def dpo(logprobs, inputs: LossInputs, algo):
    """Preference pairs: the first half of the rows are the chosen responses, the second half the
    rejected ones (pair i is rows i and i + B/2), with the reference's log-probs. On sequence
    log-probs, h = β·((π_c - ref_c) - (π_r - ref_r)), the mean over pairs of TRL's sigmoid loss
    -(1 - ε)·log σ(h) - ε·log σ(-h), ε = dpo.label_smoothing (conservative DPO; 0: plain DPO).

    dpo_margin is the mean implicit reward margin h; dpo_acc the share of pairs where it is > 0.
    """
    _needs("dpo", inputs)
    policy = (logprobs * inputs.mask).sum(-1)
    reference = (inputs.ref_logprobs * inputs.mask).sum(-1)
    (chosen, rejected), (ref_chosen, ref_rejected) = policy.chunk(2), reference.chunk(2)
    logits = algo.dpo.beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    smoothing = algo.dpo.label_smoothing
    loss = (-(1 - smoothing) * F.logsigmoid(logits) - smoothing * F.logsigmoid(-logits)).mean()
    with torch.no_grad():
        metrics = {"dpo_acc": (logits > 0).float().mean().item(), "dpo_margin": logits.mean().item()}
    return loss, metrics


def _kl_penalty(loss, metrics: dict, logprobs, inputs: LossInputs, algo):
    """+ kl.coef · KL(π ‖ ref), estimated from the policy's own samples (the rollouts)."""
    if algo.kl.fn == "none":
        return loss
    kl = _agg(KL_FNS.get(algo.kl.fn)(logprobs, inputs.ref_logprobs), inputs, algo)
    metrics["kl"] = kl.item()
    return loss + algo.kl.coef * kl


def _entropy_bonus(loss, metrics: dict, inputs: LossInputs, algo):
    """- entropy_coef · entropy of the policy (logged as 'entropy' either way)."""
    if inputs.entropy is None:
        return loss, metrics
    entropy = _agg(inputs.entropy, inputs, algo)
    metrics["entropy"] = entropy.item()
    return (loss - algo.entropy_coef * entropy if algo.entropy_coef else loss), metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] -> [B, T]: entropy of the softmax at each position."""
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def value_loss(values, old_values, returns, mask, clip: float, agg_mode: str = "token-mean", scale=None):
    """PPO critic: 0.5·max((v - R)², (v_clipped - R)²), v_clipped = old + clip(v - old, ±clip)."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped_values - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(unclipped_err, clipped_err), mask, agg_mode, scale)
    with torch.no_grad():
        clip_frac = masked_mean((clipped_err > unclipped_err).to(mask.dtype), mask).item()
    return loss, {"vf_loss": loss.item(), "vf_clip_frac": clip_frac}
