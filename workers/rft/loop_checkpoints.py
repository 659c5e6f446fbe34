"""A Loop's checkpoints (loop.py): when one is due, saving one with what resuming needs (the
loop's counters as the trainer state's `extra`), on a stop and at the end, pruning to
trainer.keep_checkpoints, and resuming from one. A mixin of Loop, whose state it reads: its
trainer, synchroniser, explorer (and overlapped explorer thread), stores, work dir and clock."""
import re
import shutil
from pathlib import Path

from .activity import TRAINER


class Checkpointing:
    def checkpoint_due(self) -> bool:
        """A checkpoint after this trainer step? At the first step the run can resume from once
        a multiple of trainer.save_interval steps is passed, or once trainer.save_interval_s
        seconds have passed since the last checkpoint (0 turns either off)."""
        step, (saved_step, saved_at) = self.trainer.step, self._saved
        every_steps, every_s = self.config.trainer.save_interval, self.config.trainer.save_interval_s
        due = (every_steps and step // every_steps > saved_step // every_steps) or (
            every_s and self.clock() - saved_at >= every_s
        )
        return bool(due) and self.resumable_at(step)

    def resumable_at(self, step: int) -> bool:
        """Memory and nccl sync keep no version anywhere but in the explorers: a resumed loop sends
        them the checkpoint's weights, which must then be a published version (a sync step)."""
        return self.sync.method == "checkpoint" or self.sync.is_publish_step(step)

    def _save_on_stop(self) -> None:
        """As a stop between steps: a checkpoint at this step to resume from, unless there is one
        already (or the trainer has not stepped yet); past the last step, the trained model."""
        if self.trainer is None or self._saved[0] == self.trainer.step:
            return
        if self.trainer.step < self.config.trainer.total_steps:
            self.save_for_resume()
        else:
            self.save_final()

    def checkpoint_dir(self, step: int) -> Path:
        return self.work_dir / "checkpoints" / f"step_{step}"

    def save(self) -> Path | None:
        if self.trainer is None:
            return None
        if self._explorer_thread is not None:
            # As the sequential loop would have it: every explorer step needing a version older
            # than this checkpoint's is done (memory sync resumes holding this version only).
            self._explorer_thread.wait_until(
                lambda: self.sync.required_version(self.explorer.step) >= self.sync.latest_version()
            )
        # Read once: the explorer counts a step only after writing its rollouts, so this many are
        # stored. A step still running beside us is written after the checkpoint; a resumed run
        # replays it (the buffer has its rollouts: has_explorer_step).
        extra = {"explorer_step": self.explorer.step if self.explorer else 0, "skipped_steps": self.skipped_steps}
        self.activity.doing(TRAINER, f"saving a checkpoint at step {self.trainer.step}")
        path = self.trainer.save_checkpoint(self.checkpoint_dir(self.trainer.step), extra)
        if self.stores.checkpoints is not None:
            self.stores.checkpoints.record(self.trainer.step // self.sync.interval, self.trainer.step, str(path))
        self._saved = (self.trainer.step, self.clock())
        self.prune_checkpoints()
        return path

    def save_final(self) -> Path | None:
        """The trained model, unless the last step's checkpoint already holds it."""
        return self.save() if self._saved[0] != self.trainer.step else None

    def save_for_resume(self) -> Path | None:
        """On a stop: a checkpoint to resume from, where the run can resume from this step (else
        it resumes from its last checkpoint)."""
        return self.save() if self.resumable_at(self.trainer.step) else None

    def prune_checkpoints(self) -> list[int]:
        """Keep the newest trainer.keep_checkpoints checkpoints; delete older ones, any newer than
        the trainer's step (left by steps a failure lost; never recorded) and half-written ones
        (a killed save). Store rows go before their directories, so a listed checkpoint always
        has its files; one the store keeps (another run loads a model from it) stays, and is asked
        about again at the next save. Returns the steps deleted."""
        root = self.work_dir / "checkpoints"
        saved = sorted(
            (int(match[1]), path) for path in root.glob("step_*") if (match := re.fullmatch(r"step_(\d+)", path.name))
        )
        up_to_now = [entry for entry in saved if entry[0] <= self.trainer.step]
        doomed = up_to_now[: -self.config.trainer.keep_checkpoints] + [e for e in saved if e[0] > self.trainer.step]
        if doomed and self.stores.checkpoints is not None:
            may_go = set(self.stores.checkpoints.forget(dict(doomed)))
            doomed = [(step, path) for step, path in doomed if step in may_go]
        for _, path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        for half_written in root.glob(".step_*"):
            shutil.rmtree(half_written, ignore_errors=True)
        return [step for step, _ in doomed]

    def start_over(self) -> None:
        """No checkpoint to go on from (none saved yet, or a curator deleted them): the trainer
        starts at step 0 with the starting model, and the versions an earlier life of the run
        published are not its own. Kept, an explorer rolled out "step 6 with v5", the old v5,
        beside a trainer at step 0; the trainer publishes them again as it replays."""
        self.sync.discard_after(0)

    def resume(self, path: str | Path) -> None:
        """Continue from a checkpoint this loop saved (the stores must be the run's own)."""
        extra = self.trainer.load_checkpoint(path)
        self._saved = (self.trainer.step, self.clock())
        self.skipped_steps = extra.get("skipped_steps", 0)  # a checkpoint saved before they were counted: none
        if self.explorer is not None:
            self.explorer.step = extra["explorer_step"]
        self.sync.discard_after(self.trainer.step // self.sync.interval)
        if self.sync.method == "memory":
            if not self.sync.is_publish_step(self.trainer.step):
                raise ValueError("memory sync resumes only from a checkpoint taken at a sync step")
            self.sync.publish(self.trainer.policy, self.trainer.step, self.trainer.full_state()["policy"])
