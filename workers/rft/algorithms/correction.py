"""Rollout correction: the engine that sampled a rollout (vLLM's kernels, bf16, another batch
shape) does not give its tokens exactly the trainer's probabilities, so the rollouts are slightly
off-policy even at staleness 0. With algorithm.rollout_correction.mode set, the trainer computes
its own logπ_old for the PPO ratio and weights each token's policy-gradient term by the importance
weight π_old / π_rollout, truncated or masked (TRL's vllm_importance_sampling_correction in
GRPOTrainer._generate_and_score_completions; verl's rollout_corr_helper.py is the same idea with
more knobs):

- token_truncate: per token, clamp(w, clip_min, clip_max);
- token_mask: per token, w, or 0 outside [clip_min, clip_max];
- sequence_truncate / sequence_mask: one weight per sequence, exp of the sum of its tokens' log
  differences, truncated or masked the same way.
"""
import torch

from workers.rft.algorithms.aggregation import masked_mean

CORRECTION_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@torch.no_grad()
def rollout_correction_weights(old_logprobs, rollout_logprobs, mask, mode: str, clip_min=None, clip_max=3.0):
    """-> (weights [B, T] for token modes or [B, 1] for sequence modes, metrics, how many tokens or
    sequences the metrics cover)."""
    if mode not in CORRECTION_MODES[1:]:
        raise ValueError(f"unknown rollout correction mode '{mode}'; known: {', '.join(CORRECTION_MODES)}")
    diff = (old_logprobs - rollout_logprobs) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    raw = diff.exp()
    low = clip_min if clip_min is not None else 0.0
    high = clip_max if clip_max is not None else float("inf")
    outside = (raw < low) | (raw > high)
    weights = raw.clamp(low, high) if mode.endswith("truncate") else raw.masked_fill(outside, 0.0)
    kept = mask if not mode.startswith("sequence") else (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)
    metrics = {
        "is_weight_mean": masked_mean(weights, kept).item(),
        "is_raw_weight_mean": masked_mean(raw.clamp(max=1e6), kept).item(),
        # the share of tokens (token modes) or sequences whose weight was truncated or zeroed
        "is_corrected_frac": masked_mean(outside.to(mask.dtype), kept).item(),
    }
    return weights, metrics, kept.sum().item()
