"""What the engine needs from storage, and nothing more.

The Django apps implement these against Postgres; memory.py implements them in memory for the
headless CLI, benchmarks and tests. Every method is called from one component's loop (explorer or
trainer); the overlapped loop (loop.py, offset >= 1) runs the two components in two threads of one
process, so a store's methods may be called from both at once and must be thread-safe.
"""
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .experience import Experience, PreferencePair, Task, TaskKey, TaskStats


class TaskSource(Protocol):
    """One taskset, as one run's explorer sees it: the run's draws (times_sampled) and what its
    task selector learned (stats) are the run's own."""

    def tasks(self) -> list[Task]:
        """All tasks in taskset order, synthetic ones included (after the taskset's own), with their
        current priority, times_sampled and stats."""

    def task_keys(self, with_stats: bool = False) -> list[TaskKey]:
        """What orders every task for the explorer's pick (id, priority, times_sampled; stats
        with_stats, for a selector that learns, else None), in tasks()' order, without their
        prompts: a step without a task pipeline reads these, then its batch's tasks."""

    def tasks_with_ids(self, task_ids: Sequence[int]) -> list[Task]:
        """The tasks with these ids, in that order, as tasks() has them (an explorer's share of a
        step; the batch a learning selector learns from when the step finishes)."""

    def mark_sampled(self, task_ids: Sequence[int], stats: Mapping[int, TaskStats] | None = None) -> None:
        """times_sampled += 1 for each id (an id listed twice counts twice), and each task of
        `stats` (some of the ids) gets those stats in place of its own: a finished step's draws and
        what the selector learned from it, written at once (a selection reads both)."""

    def count_solved(self, streak: int) -> int:
        """How many tasks' stats have solved_streak >= `streak` (>= 1): those whose latest
        `streak` groups in a row had every rollout pass (a learning selector's retired tasks)."""

    def add_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        """Store new (synthetic) tasks; return them with ids assigned."""


class ExperienceBuffer(Protocol):
    """The experiences of one run, plus the expert data and preference pairs it trains on."""

    def write(self, experiences: Sequence[Experience]) -> int:
        """Store experiences as ready; return how many were new. Idempotent for rollouts: one with
        the natural key (run, explorer_step, task_id, rollout_index) of a stored one is skipped,
        so a replayed explorer step writes nothing twice."""

    def count(self, *, sources: Sequence[str], group_prefix: str = "") -> int:
        """How many stored experiences (any status) have a source in `sources` and a group id
        starting with `group_prefix`."""

    def has_explorer_step(self, step: int) -> bool:
        """Rollouts of explorer step `step` are stored: a restarted run replaying it has nothing to do."""

    def sample(self, n: int, *, sources: Sequence[str], min_model_version: int | None = None) -> list[Experience]:
        """Up to n ready experiences whose source is in `sources`, in sampling.sample_key's order:
        least used first (a row's priority counting as uses it has not had), then rollouts oldest
        first and expert-only samples newest first, then by id. Rollouts and synthetic experiences with
        model_version below `min_model_version` are too stale and are skipped; expert and human
        data never go stale. Sampling changes no use count or status (the trainer calls `mark_used`
        once the step is done); a buffer shared by several trainers (Postgres) holds what it
        returns until then, so no two trainers take the same row. tests/contract holds every
        implementation to this."""

    def sample_mix(
        self, n: int, n_expert: int, *, min_model_version: int | None = None
    ) -> tuple[list[Experience], list[Experience]]:
        """sample(n, sources=USUAL_SOURCES, min_model_version=...) and sample(n_expert,
        sources=EXPERT_SOURCES), as one sample: a MIX step's batch (one round trip on Postgres)."""

    def mark_used(self, *, consumed: Sequence[Experience] = (), reused: Sequence[Experience] = ()) -> None:
        """A step is done with what it sampled: use_count += 1 on all of them, and the `consumed`
        leave the ready pool (status 'consumed'): rollouts are trained on once, expert data is
        `reused`. One call a step (one statement on Postgres, a MIX step's two kinds together)."""

    def sample_pairs(self, n: int, *, max_uses: int | None = None) -> list[PreferencePair]:
        """Up to n preference pairs for DPO, least used first, of those used fewer than `max_uses`
        times (None: any); counts as a use."""


class ExpertData(Protocol):
    """An imported expert dataset a run trains on (buffer.expert_dataset): written prompts and
    responses, or preference pairs, in no model's tokens yet."""

    def seed(self, to_experience: Callable[[str | list[dict], str], Experience]) -> int:
        """Copy the dataset into the run's buffer, each response made an experience by
        to_experience(prompt, response) (the run's prompt format and tokenizer): expert
        experiences to imitate, or preference pairs for DPO. A restart carries an unfinished copy
        on. Returns how many experiences it wrote."""


class MetricSink(Protocol):
    def log(self, role: str, step: int, values: dict[str, float]) -> None:
        """One point per role ('explorer' | 'trainer' | 'eval' | 'system') and step, all scalars
        together. Logging a (role, step) again replaces the point."""

    def replayed(self, role: str, step: int, model_version: int | None = None) -> None:
        """The role did `step` again from what is stored (a resumed run replays the steps after
        its checkpoint): its point stays as it is; the role is at that step again, holding
        `model_version` (the explorer's weights), as a point would have said."""


class CheckpointStore(Protocol):
    def record(self, version: int, step: int, path: str) -> None:
        """A weights directory was published: model `version`, after trainer `step`, at `path`."""

    def forget(self, checkpoints: Mapping[int, Path]) -> list[int]:
        """Of these checkpoints ({trainer step: directory}) due for deletion (keep_checkpoints, or
        lost steps), the steps that may go, forgotten here: a store may keep one that something
        else still loads a model from."""


class StepClaims(Protocol):
    """Explorer steps shared by several explorers (explorer.engine_num > 1), each in a process of
    its own: the unit is a task's group of rollouts. Bound to one explorer (the caller)."""

    def open(self, step: int, select: Callable[[], list[int]]) -> list[int]:
        """The step's task ids, in batch order: `select()`ed by the first explorer to open the
        step, read back by the others (a task pipeline may add tasks: it runs once)."""

    def claim(self, step: int) -> list[int]:
        """An even share (the step's groups over the explorers serving the run now) of the
        groups (task ids) that no live explorer holds or has done, now this explorer's; [] when
        none is left."""

    def done(self, step: int, task_ids: Sequence[int], part: dict) -> None:
        """Those groups' rollouts are stored; `part` is what this explorer measured on them."""

    def finish(self, step: int, then: Callable[[list[dict]], None]) -> bool:
        """Once every group of the step is done, exactly one explorer (the first to ask) runs
        then(parts), atomically with marking the step finished; True from then on, to every
        explorer. False while groups are left."""


class WeightGroup(Protocol):
    """Where the trainer and its explorers meet for synchronizer.method 'nccl' (the run's record of
    it): the trainer opens a group at an address of its machine, each explorer joins the group
    opened last. Bound to one side: `rank` 0 is the trainer, explorers are 1..explorers."""

    rank: int
    secret: str  # the run's, which every side proves it knows before it trusts another (distributed.handshake)

    def open(self, port: int) -> tuple[int, str, int, int]:
        """Trainer: announce a new group at this machine's address and `port`, for the run's
        explorers; returns (generation, host, port, explorers)."""

    def current(self) -> tuple[int, str, int, int] | None:
        """Explorer: (generation, host, port, explorers) of the open group; None while none is."""

    def close(self, generation: int) -> None:
        """Trainer: that group is over (no explorer joins it any more)."""


@dataclass
class Stores:
    """Everything a run reads and writes outside its own process."""

    task_source: TaskSource
    buffer: ExperienceBuffer
    metrics: MetricSink
    eval_source: TaskSource | None = None  # for eval and bench
    expert_source: TaskSource | None = None  # whose answers become expert data (MIX, SFT)
    expert_data: ExpertData | None = None  # buffer.expert_dataset: imported expert data or pairs (web app only)
    checkpoints: CheckpointStore | None = None
    claims: StepClaims | None = None  # how explorers that are workers of their own share the steps
    weight_group: WeightGroup | None = None  # synchronizer.method 'nccl': where trainer and explorers meet
    # Called at the end of a thread (other than the caller's) that used the stores: Postgres
    # closes that thread's connection there.
    thread_finished: Callable[[], None] | None = None
