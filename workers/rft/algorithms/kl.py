"""Per-token KL estimators between the policy and the reference, from log-probs of tokens the
policy sampled: d = logπ - logπ_ref. k1 is unbiased but noisy and can be negative; k2 = d²/2 is
low-variance but biased; k3 = e^(-d) - 1 + d is unbiased and never negative (Schulman, 2020)."""
import torch

from workers.rft.registry import Registry

KL_FNS = Registry("KL fn")


@KL_FNS.register("none")
def none(logprobs, ref_logprobs):
    return torch.zeros_like(logprobs)


@KL_FNS.register("k1")
def k1(logprobs, ref_logprobs):
    return logprobs - ref_logprobs


@KL_FNS.register("k2")
def k2(logprobs, ref_logprobs):
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_FNS.register("k3")
def k3(logprobs, ref_logprobs):
    d = logprobs - ref_logprobs
    return torch.exp(-d) - 1 + d


@KL_FNS.register("low_var_kl")
def low_var_kl(logprobs, ref_logprobs):
    """k3 clamped to [-10, 10]; d is clamped to [-20, 20] first so exp stays finite and grads are not NaN."""
    d = (logprobs - ref_logprobs).clamp(-20, 20)
    return (torch.exp(-d) - 1 + d).clamp(-10, 10)
