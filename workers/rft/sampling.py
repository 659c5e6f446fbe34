"""Sample strategies: what one trainer batch is made of.

`default`: the algorithm's kind of data only: usual experiences (rollouts, synthetic) for RL
algorithms, expert data (expert, human edits) for SFT.
`mix`: usual experiences plus expert ones, so that expert data is `expert_data_ratio` of the batch.
`pairs`: preference pairs (DPO), batch_size of them.
The algorithm picks the strategy (`AlgorithmSpec.sample_strategy`, see algorithms/presets.py).

Human feedback (ratings as rewards, flags, edits as expert data) is applied by the buffer as it
samples, with the functions at the end of this module.
"""
from dataclasses import dataclass, field

from .algorithms import ADVANTAGE_FNS, group_advantage
from .algorithms.advantages import stepwise
from .experience import EXPERT_SOURCES, Experience, PreferencePair
from .registry import Registry

USUAL_SOURCES = ("rollout", "synthetic")
SAMPLE_STRATEGIES = Registry("sample strategy")


@dataclass
class TrainBatch:
    usual: list[Experience] = field(default_factory=list)  # trained with the policy loss and their advantages
    expert: list[Experience] = field(default_factory=list)  # imitated (SFT loss)
    pairs: list[PreferencePair] = field(default_factory=list)  # preferences (DPO)

    def __len__(self) -> int:
        return len(self.usual) + len(self.expert) + len(self.pairs)


def min_model_version(current_version: int, max_staleness: int | None) -> int | None:
    return None if max_staleness is None else current_version - max_staleness


@SAMPLE_STRATEGIES.register("default")
def default(
    buffer, batch_size: int, current_version: int, *, max_staleness=None, uses_rollouts=True, **_
) -> TrainBatch:
    if not uses_rollouts:
        return TrainBatch(expert=buffer.sample(batch_size, sources=EXPERT_SOURCES))
    usual = buffer.sample(
        batch_size, sources=USUAL_SOURCES, min_model_version=min_model_version(current_version, max_staleness)
    )
    return TrainBatch(usual=usual)


@SAMPLE_STRATEGIES.register("mix")
def mix(
    buffer, batch_size: int, current_version: int, *, max_staleness=None, expert_data_ratio=0.25, **_
) -> TrainBatch:
    """batch_size usual experiences, plus as many expert ones as make `expert_data_ratio` of the whole."""
    if expert_data_ratio >= 1:
        return default(buffer, batch_size, current_version, uses_rollouts=False)
    n_expert = round(batch_size * expert_data_ratio / (1 - expert_data_ratio))
    usual, expert = buffer.sample_mix(
        batch_size, n_expert, min_model_version=min_model_version(current_version, max_staleness)
    )
    return TrainBatch(usual=usual, expert=expert)


@SAMPLE_STRATEGIES.register("pairs")
def pairs(buffer, batch_size: int, current_version: int, *, max_pair_uses=None, **_) -> TrainBatch:
    """Up to batch_size preference pairs, least used first, of those used fewer than max_pair_uses
    times (None: any); sampling them counts as their use."""
    return TrainBatch(pairs=buffer.sample_pairs(batch_size, max_uses=max_pair_uses))


def pair_use_limit(config) -> int | None:
    """The most trainer steps one preference pair trains in (algorithm.dpo.max_pair_uses; None: no
    limit). Unset, 1 in mode both: its pairs come as annotators compare the run's answers, a few at
    a time, and least used first cycled the first handful through every step (one pair, 100 steps);
    TRL's online DPO trains each pair it makes once, and Trinity-RFT's experience queue hands a
    batch out once unless a replay buffer is asked for (its use_count_limit). In mode train the
    pairs are a fixed set (source runs, an imported dataset) taken in passes, as offline DPO's epochs."""
    limit = config.algorithm.dpo.max_pair_uses
    return limit if limit is not None else (1 if config.mode == "both" else None)


def empty_batch_why(uses_rollouts: bool) -> str:
    """Why a trainer step that counts came out empty (Trainer.waits_for_data), for a person."""
    if uses_rollouts:
        return ("the rollouts of the explorer steps they train on were all filtered out (explorer.pipeline, "
                "algorithm.drop_zero_std_groups), flagged, older than buffer.max_staleness or unrated "
                "(feedback.rated_only)")
    return "promote_to_expert had copied no rollout into expert data yet"


# -- human feedback ---------------------------------------------------------------------------------
# Annotators' ratings arrive in the buffer as the reward component HUMAN_REWARD (their mean,
# normalised to [0, 1] on the run's scale). The buffer applies the run's `feedback` settings to
# what it samples, through the two functions below, so every sample strategy trains on them.

HUMAN_REWARD = "human"


def sample_key(experience: Experience, newest_first: bool) -> tuple:
    """What a buffer samples first, lowest first: the least used, where a row's priority counts as
    uses it has not had (Trinity-RFT's linear-decay priority: a row a curator gives priority 2
    goes before the unused ones and is reused twice more than they are); then rollouts oldest first
    (they go stale) and expert data newest first (a fresh human edit trains within a step or two,
    not after a pass over the 800 seeded rows of the demo); then the id."""
    step = -experience.explorer_step if newest_first else experience.explorer_step
    return (experience.use_count - experience.priority, step, experience.id)


def reward_with_feedback(experience: Experience, feedback, human: float | None = None) -> float | None:
    """The reward an experience trains with under the run's feedback settings (a FeedbackConfig).
    `human` stands in for the rating of an unrated experience (None: it has none)."""
    return _with_rating(experience, feedback, experience.reward_components.get(HUMAN_REWARD, human))


def _with_rating(experience: Experience, feedback, human: float | None) -> float | None:
    if human is None or feedback.reward_mode == "none":
        return experience.reward
    if feedback.reward_mode == "override":
        return human
    return (experience.reward or 0.0) + feedback.reward_weight * human


def _episode(experience: Experience):
    """The episode a step experience of a multi-turn rollout belongs to (None: a whole rollout)."""
    return experience.metadata.get("rollout") if experience.source == "rollout" else None


def _ratings(members: list[Experience]) -> tuple[dict, float | None]:
    """({episode: its rating}, the group's): a step experience trains with its episode's rating, the
    mean of its rated steps', so an episode's steps keep one reward between them and a long episode
    counts once in the group's mean, as in its advantage (advantages.stepwise)."""
    rated, episodes = [], {}
    for m in members:
        if HUMAN_REWARD in m.reward_components:
            if _episode(m) is None:
                rated.append(m.reward_components[HUMAN_REWARD])
            else:
                episodes.setdefault(_episode(m), []).append(m.reward_components[HUMAN_REWARD])
    episodes = {episode: sum(r) / len(r) for episode, r in episodes.items()}
    rated += episodes.values()
    return episodes, (sum(rated) / len(rated) if rated else None)


def apply_human_feedback(batch: list[Experience], groups: dict[str, list[Experience]], config) -> None:
    """Give the batch's rollouts their rewards under `config.feedback` and, where the algorithm
    uses group advantages, recompute their advantages from the new rewards of their whole group.

    `groups` maps the id of each group with a rating to the experiences its advantages compare
    (the batch's own among them; with feedback.rated_only only the rated ones). An unrated member
    of such a group counts as its group's mean rating: neither better nor worse than what the
    annotators saw, so a rating moves only the rated rollouts. Step experiences of multi-turn
    episodes train with their episode's rating and are compared episode by episode, as the
    explorer compared them (they were compared step by step: a 3-step episode counted 3 times).
    Other groups keep their rewards and the advantages the explorer gave them."""
    feedback = config.feedback
    ratings = {group_id: _ratings(members) for group_id, members in groups.items()}

    def reward(e: Experience) -> float | None:
        episodes, group = ratings.get(e.group_id, ({}, None))
        if _episode(e) is not None:
            return _with_rating(e, feedback, episodes.get(_episode(e), group))
        return reward_with_feedback(e, feedback, group)

    rewards = [reward(e) for e in batch]
    advantages = {}
    if (advantage := group_advantage(config)) is not None:
        fn, params = advantage
        for group_id, members in groups.items():
            group_rewards = [reward(m) or 0.0 for m in members]
            ids = [group_id] * len(members)
            if all(_episode(m) is not None for m in members):
                values, _ = stepwise(fn, group_rewards, ids, [_episode(m) for m in members], **params)
            else:
                values, _ = ADVANTAGE_FNS.get(fn)(group_rewards, ids, **params)
            advantages.update(zip((m.id for m in members), values.tolist()))
    # Assigned last: the batch's experiences may be the groups' members themselves.
    for experience, value in zip(batch, rewards):
        experience.reward = value
        experience.advantage = advantages.get(experience.id, experience.advantage)
