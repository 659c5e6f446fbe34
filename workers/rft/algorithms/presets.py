"""What each algorithm.name means: which advantage fn and policy loss, and what the run must provide."""
from dataclasses import dataclass, replace


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


ALGORITHMS = {
    "grpo": AlgorithmSpec("grpo", "ppo"),
    "ppo": AlgorithmSpec("ppo", "ppo", needs_critic=True),
    "rloo": AlgorithmSpec("rloo", "ppo"),
    "reinforce_plus_plus": AlgorithmSpec("reinforce_plus_plus", "ppo"),
    "sft": AlgorithmSpec(None, "sft", uses_rollouts=False, uses_expert=True),
    "dpo": AlgorithmSpec(
        None, "dpo", needs_reference=True, sample_strategy="pairs", uses_rollouts=False, uses_expert=True
    ),
    "mix": AlgorithmSpec("grpo", "mix", sample_strategy="mix", uses_expert=True),
}

# Advantage fns that compare rollouts of one task: they need algorithm.repeat_times >= 2.
GROUP_ADVANTAGE_FNS = ("grpo", "rloo", "reinforce_plus_plus")


def resolve(config) -> AlgorithmSpec:
    """The preset of config.algorithm.name with the config's overrides applied (a RunConfig)."""
    algo = config.algorithm
    spec = ALGORITHMS[algo.name]
    advantage_fn = algo.advantage_fn or spec.advantage_fn
    policy_loss = algo.policy_loss or spec.policy_loss
    return replace(
        spec,
        advantage_fn=advantage_fn,
        policy_loss=policy_loss,
        needs_reference=spec.needs_reference or algo.kl.fn != "none",
        needs_critic=advantage_fn == "ppo",
        sample_strategy="mix" if policy_loss == "mix" else spec.sample_strategy,
        uses_expert=spec.uses_expert or policy_loss == "mix",
    )
