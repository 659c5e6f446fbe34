"""What each algorithm.name means: which advantage fn and policy loss, and what the run must provide."""
from dataclasses import dataclass, replace

from workers.rft.algorithms.advantages import GROUP_ADVANTAGE_FNS, TOKEN_ADVANTAGE_FNS, WHITENED_ADVANTAGE_FNS
from workers.rft.algorithms.losses import EXPERT, LOSS_PARTS, USUAL


@dataclass(frozen=True)
class AlgorithmSpec:
    advantage_fn: str | None  # None: trains on stored data without advantages (sft, dpo)
    policy_loss: str
    needs_reference: bool = False
    needs_critic: bool = False
    # How a trainer batch is drawn (sampling.SAMPLE_STRATEGIES): 'default' the algorithm's kind of
    # data, 'mix' usual and expert experiences blended, 'pairs' preference pairs.
    sample_strategy: str = "default"
    uses_rollouts: bool = True
    uses_expert: bool = False

    @property
    def group_advantages(self) -> bool:
        """The explorer compares each task's rollouts (GROUP_ADVANTAGE_FNS)."""
        return self.advantage_fn in GROUP_ADVANTAGE_FNS

    @property
    def token_advantages(self) -> bool:
        """The trainer computes advantages per token from the rewards (GAE, REINFORCE++)."""
        return self.advantage_fn in TOKEN_ADVANTAGE_FNS

    @property
    def whitens(self) -> bool:
        """The trainer whitens the advantages over the whole batch."""
        return self.advantage_fn in WHITENED_ADVANTAGE_FNS


ALGORITHMS = {
    "grpo": AlgorithmSpec("grpo", "ppo"),
    "ppo": AlgorithmSpec("ppo", "ppo", needs_critic=True),
    "rloo": AlgorithmSpec("rloo", "ppo"),
    "reinforce_plus_plus": AlgorithmSpec("reinforce_plus_plus", "ppo"),
    "reinforce_plus_plus_baseline": AlgorithmSpec("reinforce_plus_plus_baseline", "ppo"),
    "opmd": AlgorithmSpec("opmd", "opmd"),
    "sft": AlgorithmSpec(None, "sft", uses_rollouts=False, uses_expert=True),
    "dpo": AlgorithmSpec(
        None, "dpo", needs_reference=True, sample_strategy="pairs", uses_rollouts=False, uses_expert=True
    ),
    "mix": AlgorithmSpec("grpo", "mix", sample_strategy="mix", uses_expert=True),
    "mix_chord": AlgorithmSpec("grpo", "mix_chord", sample_strategy="mix", uses_expert=True),
}


def group_advantage(config) -> tuple[str, dict] | None:
    """The run's group advantage fn and its parameters, as the explorer applies it; None when the
    algorithm compares no groups (GAE and REINFORCE++ read the rewards in the trainer, SFT/DPO use none)."""
    spec, algo = resolve(config), config.algorithm
    if not spec.group_advantages:
        return None
    params = {
        "grpo": {"epsilon": algo.epsilon, "std_normalize": algo.std_normalize, "std_unbiased": algo.std_unbiased},
        "opmd": {"baseline": algo.opmd.baseline, "tau": algo.opmd.tau},
    }
    return spec.advantage_fn, params.get(spec.advantage_fn, {})


def resolve(config) -> AlgorithmSpec:
    """The preset of config.algorithm.name with the config's overrides applied (a RunConfig)."""
    algo = config.algorithm
    spec = ALGORITHMS[algo.name]
    advantage_fn = algo.advantage_fn or spec.advantage_fn
    policy_loss = algo.policy_loss or spec.policy_loss
    mixes = LOSS_PARTS[policy_loss] == (USUAL, EXPERT)
    return replace(
        spec,
        advantage_fn=advantage_fn,
        policy_loss=policy_loss,
        needs_reference=spec.needs_reference or algo.kl.fn != "none",
        needs_critic=advantage_fn == "ppo",
        sample_strategy="mix" if mixes else spec.sample_strategy,
        uses_expert=spec.uses_expert or EXPERT in LOSS_PARTS[policy_loss],
    )
