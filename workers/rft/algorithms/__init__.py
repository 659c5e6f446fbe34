"""The RL math: pure tensor functions, looked up by name from the run config."""
from workers.rft.algorithms.advantages import ADVANTAGE_FNS, compute_gae, grpo, reinforce_plus_plus, rloo, zero_std_mask
from workers.rft.algorithms.aggregation import AGG_MODES, aggregate, masked_mean
from workers.rft.algorithms.kl import KL_FNS
from workers.rft.algorithms.losses import (
    EXPERT,
    PAIRS,
    POLICY_LOSSES,
    USUAL,
    LossInputs,
    dpo,
    entropy_from_logits,
    mix,
    ppo,
    sft,
    value_loss,
)
from workers.rft.algorithms.presets import ALGORITHMS, GROUP_ADVANTAGE_FNS, AlgorithmSpec, resolve

__all__ = [
    "ADVANTAGE_FNS", "AGG_MODES", "ALGORITHMS", "EXPERT", "GROUP_ADVANTAGE_FNS", "KL_FNS", "PAIRS", "POLICY_LOSSES",
    "USUAL", "AlgorithmSpec", "LossInputs", "aggregate", "compute_gae", "dpo", "entropy_from_logits", "grpo",
    "masked_mean", "mix", "ppo", "reinforce_plus_plus", "resolve", "rloo", "sft", "value_loss", "zero_std_mask",
]
