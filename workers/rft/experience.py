"""The records the engine passes around: tasks in, experiences and preference pairs out.

Field names follow the Postgres data model (apps/tasksets, apps/buffer) so the Django stores map
them one to one. Token arrays are lists, or 1-D numpy arrays where a store reads many at once
(the Postgres buffer's sample: building Python lists of 256 rows of 512-token arrays took longer
than the statement); the stores pack them.
"""
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np

SOURCES = ("rollout", "expert", "human_edit", "synthetic")
# Sources that carry a reference answer to imitate (the SFT half of MIX), not a reward to climb.
EXPERT_SOURCES = ("expert", "human_edit")


class TaskStats(NamedTuple):
    """What one run learned of one task from its own groups of rollouts, for a task selector that
    learns (task_selectors.DifficultyBased): its pass rate's evidence, discounted by the steps since
    (Trinity-RFT's Beta estimate, alpha = 1 + successes), as of `seen_step`, the explorer step of its
    latest group; and how many of its latest groups in a row had every rollout pass. (A tuple: a
    store builds one per task it read.)"""

    successes: float
    failures: float
    seen_step: int
    solved_streak: int = 0


@dataclass
class Task:
    """One problem: a prompt (plain text or chat messages) and the answer a reward fn checks against."""

    id: int | None  # assigned by the task source; None for a synthetic task not yet stored
    prompt: str | list[dict]
    answer: str = ""
    metadata: dict = field(default_factory=dict)
    difficulty: float = 0.0
    priority: float = 0.0
    times_sampled: int = 0
    stats: TaskStats | None = None  # the run's; None until a group of it was recorded


class TaskKey(NamedTuple):
    """What orders a task for the explorer's pick (Explorer.select_tasks), without its prompt."""

    id: int
    priority: float
    times_sampled: int
    stats: TaskStats | None = None


# The group id of each expert experience seeded from the expert taskset starts with it.
EXPERT_GROUP = "expert-"


@dataclass(eq=False)
class Experience:
    """One response to one task with everything the trainer needs.

    `response_ids`, `action_mask` and `logprobs` are aligned: one entry per response token
    (construction refuses anything else). `action_mask` is 1 where the model produced the token (0
    for tokens a multi-turn environment inserted), so losses only touch the model's own actions.
    `logprobs` is None where no model generated the response.
    """

    task_id: int | None
    group_id: str  # rollouts of one task in one explorer step share it (GRPO groups)
    rollout_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    action_mask: list[int]
    source: str = "rollout"
    prompt_text: str = ""
    response_text: str = ""
    messages: list[dict] | None = None
    logprobs: list[float] | None = None  # generation logprobs: the behaviour policy's logπ_old
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None
    model_version: int = 0
    priority: float = 0.0
    use_count: int = 0
    explorer_step: int = 0
    metadata: dict = field(default_factory=dict)  # finish_reason, truncated, task answer, ...
    id: int | None = None  # assigned by the buffer

    def __post_init__(self):
        """Misaligned arrays are refused where they are written, not deep in the trainer's collation."""
        tokens = len(self.response_ids)
        if self.action_mask is None or len(self.action_mask) != tokens:
            raise ValueError(_misaligned("action_mask", self.action_mask, tokens))
        if self.logprobs is not None and len(self.logprobs) != tokens:
            raise ValueError(_misaligned("logprobs", self.logprobs, tokens))

    def __eq__(self, other):
        """Field by field, a token array equal to a list of the same values."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    @property
    def key(self) -> tuple:
        """The natural key a replayed explorer step must not duplicate (the run is the store's)."""
        return (self.explorer_step, self.task_id, self.rollout_index)

    @property
    def promoted_from(self) -> tuple | None:
        """The key of the rollout an expert copy was promoted from (promote_to_expert), or None."""
        key = self.metadata.get("promoted_from") if self.source == "expert" else None
        return tuple(key) if key else None


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))  # shapes differ (None, another length): False
    return a == b


def _misaligned(name: str, values: list | None, tokens: int) -> str:
    got = "None" if values is None else f"{len(values)} entries"
    none = " (no logprobs is None, not [])" if name == "logprobs" and not values else ""
    return f"experience {name} has {got} for {tokens} response tokens: one per token{none}"


@dataclass
class PreferencePair:
    """A DPO pair: two responses to one prompt, `chosen` preferred over `rejected`."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    task_id: int | None = None
    metadata: dict = field(default_factory=dict)
    id: int | None = None
    # 1 where the model wrote the token, as Experience.action_mask (None: all of it). Two
    # multi-turn episodes compared: their environment turns are not the policy's to prefer.
    chosen_mask: list[int] | None = None
    rejected_mask: list[int] | None = None

    def as_experiences(self) -> tuple["Experience", "Experience"]:
        """Both sides as experiences, so the trainer's collation serves DPO too."""
        chosen, rejected = (
            Experience(self.task_id, f"pair-{self.id}", index, self.prompt_ids, ids,
                       [1] * len(ids) if mask is None else list(mask), source="human_edit")
            for index, (ids, mask) in enumerate(
                ((self.chosen_ids, self.chosen_mask), (self.rejected_ids, self.rejected_mask)))
        )
        return chosen, rejected
