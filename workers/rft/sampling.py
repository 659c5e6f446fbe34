"""Sample strategies: what one trainer batch is made of.

`default`: the algorithm's kind of data only: usual experiences (rollouts, synthetic) for RL
algorithms, expert data (expert, human edits) for SFT.
`mix`: usual experiences plus expert ones, so that expert data is `expert_data_ratio` of the batch.
"""
from dataclasses import dataclass, field

from .experience import EXPERT_SOURCES, Experience
from .registry import Registry

USUAL_SOURCES = ("rollout", "synthetic")
SAMPLE_STRATEGIES = Registry("sample strategy")


@dataclass
class TrainBatch:
    usual: list[Experience] = field(default_factory=list)  # trained with the policy loss and their advantages
    expert: list[Experience] = field(default_factory=list)  # imitated (SFT loss)

    def __len__(self) -> int:
        return len(self.usual) + len(self.expert)


def min_model_version(current_version: int, max_staleness: int | None) -> int | None:
    return None if max_staleness is None else current_version - max_staleness


@SAMPLE_STRATEGIES.register("default")
def default(buffer, batch_size: int, current_version: int, *, max_staleness=None, uses_rollouts=True, **_) -> TrainBatch:
    if not uses_rollouts:
        return TrainBatch(expert=buffer.sample(batch_size, sources=EXPERT_SOURCES))
    usual = buffer.sample(
        batch_size, sources=USUAL_SOURCES, min_model_version=min_model_version(current_version, max_staleness)
    )
    return TrainBatch(usual=usual)


@SAMPLE_STRATEGIES.register("mix")
def mix(buffer, batch_size: int, current_version: int, *, max_staleness=None, expert_data_ratio=0.25, **_) -> TrainBatch:
    """batch_size usual experiences, plus as many expert ones as make `expert_data_ratio` of the whole."""
    if expert_data_ratio >= 1:
        return default(buffer, batch_size, current_version, uses_rollouts=False)
    usual = default(buffer, batch_size, current_version, max_staleness=max_staleness).usual
    n_expert = round(batch_size * expert_data_ratio / (1 - expert_data_ratio))
    return TrainBatch(usual=usual, expert=buffer.sample(n_expert, sources=EXPERT_SOURCES))
