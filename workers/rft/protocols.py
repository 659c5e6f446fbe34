"""What the engine needs from storage, and nothing more.

The Django apps implement these against Postgres; memory.py implements them in memory for the
headless CLI, benchmarks and tests. Every method is called from one role's loop (explorer or
trainer); the overlapped loop (loop.py, offset >= 1) runs the two roles in two threads of one
process, so a store's methods may be called from both at once and must be thread-safe.
"""
from collections.abc import Sequence
from typing import Protocol

from .experience import Experience, PreferencePair, Task


class TaskSource(Protocol):
    """One taskset, as the explorer sees it."""

    def tasks(self) -> list[Task]:
        """All tasks, synthetic ones included, with their current priority and times_sampled."""

    def mark_sampled(self, task_ids: Sequence[int]) -> None:
        """times_sampled += 1 for each id (an id listed twice counts twice)."""

    def add_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        """Store new (synthetic) tasks; return them with ids assigned."""


class ExperienceBuffer(Protocol):
    """The experiences of one run, plus the expert data and preference pairs it trains on."""

    def write(self, experiences: Sequence[Experience]) -> int:
        """Store experiences as ready; return how many were new. Idempotent for rollouts: one with
        the natural key (run, explorer_step, task_id, rollout_index) of a stored one is skipped,
        so a replayed explorer step writes nothing twice."""

    def count(self, *, sources: Sequence[str]) -> int:
        """How many stored experiences (any status) have a source in `sources`."""

    def has_explorer_step(self, step: int) -> bool:
        """Rollouts of explorer step `step` are stored: a restarted run replaying it has nothing to do."""

    def sample(self, n: int, *, sources: Sequence[str], min_model_version: int | None = None) -> list[Experience]:
        """Up to n ready experiences whose source is in `sources`: least used first, then oldest
        (explorer_step, then id). Rollouts and synthetic experiences with model_version below
        `min_model_version` are too stale and are skipped; expert and human data never go stale.
        Sampling changes nothing: the trainer calls `mark_used` once the step is done."""

    def mark_used(self, experiences: Sequence[Experience], *, consumed: bool) -> None:
        """use_count += 1; with consumed=True they also leave the ready pool (status 'consumed'):
        rollouts are trained on once, expert data is reused (consumed=False)."""

    def sample_pairs(self, n: int) -> list[PreferencePair]:
        """Up to n preference pairs for DPO, least used first; counts as a use."""


class MetricSink(Protocol):
    def log(self, role: str, step: int, values: dict[str, float]) -> None:
        """One point per role ('explorer' | 'trainer' | 'eval' | 'system') and step, all scalars
        together. Logging a (role, step) again replaces the point."""


class CheckpointStore(Protocol):
    def record(self, version: int, step: int, path: str) -> None:
        """A weights directory was published: model `version`, after trainer `step`, at `path`."""

    def forget(self, steps: Sequence[int]) -> None:
        """The checkpoints of these trainer steps are about to be deleted (keep_checkpoints)."""
