"""The RL math: pure tensor functions, looked up by name from the run config."""
from workers.rft.algorithms.advantages import (
    ADVANTAGE_FNS,
    GROUP_ADVANTAGE_FNS,
    TOKEN_ADVANTAGE_FNS,
    WHITENED_ADVANTAGE_FNS,
    compute_gae,
    discounted_returns,
    grpo,
    last_token_rewards,
    opmd,
    reinforce_plus_plus_baseline,
    rloo,
    whiten,
    zero_std_mask,
    zero_variance_share,
)
from workers.rft.algorithms.aggregation import AGG_MODES, aggregate, masked_mean
from workers.rft.algorithms.correction import CORRECTION_MODES, rollout_correction_weights
from workers.rft.algorithms.kl import KL_FNS
from workers.rft.algorithms.losses import (
    EXPERT,
    LOSS_PARTS,
    PAIRS,
    POLICY_LOSSES,
    TOKEN_MEANS,
    USUAL,
    LossInputs,
    chord_mu,
    dpo,
    entropy_from_logits,
    mix,
    ppo,
    reads_entropy,
    sft,
    value_loss,
)
from workers.rft.algorithms.presets import ALGORITHMS, AlgorithmSpec, group_advantage, resolve

__all__ = [
    "ADVANTAGE_FNS", "AGG_MODES", "ALGORITHMS", "CORRECTION_MODES", "EXPERT", "GROUP_ADVANTAGE_FNS", "KL_FNS",
    "LOSS_PARTS", "PAIRS", "POLICY_LOSSES", "TOKEN_ADVANTAGE_FNS", "TOKEN_MEANS", "USUAL", "WHITENED_ADVANTAGE_FNS",
    "AlgorithmSpec", "LossInputs", "aggregate", "chord_mu", "compute_gae", "discounted_returns", "dpo",
    "entropy_from_logits", "grpo", "group_advantage", "last_token_rewards", "masked_mean", "mix", "opmd", "ppo",
    "reads_entropy", "reinforce_plus_plus_baseline", "resolve", "rloo", "rollout_correction_weights", "sft",
    "value_loss", "whiten", "zero_std_mask", "zero_variance_share",
]
