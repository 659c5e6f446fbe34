"""The explorer of an overlapped loop (loop.py, synchronizer.offset >= 1): a thread beside the
trainer's that runs explorer step t once the trainer has allowed the version it needs."""
import threading
from collections.abc import Callable

import torch


class ExplorerThread(threading.Thread):
    """The loop's explorer beside its trainer: explorer step t starts once the trainer has allowed
    version required_version(t). The thread ends after the last step needing at most
    `last_version`, on stop(), or on an error, which the trainer's thread re-raises (a Stop that
    reached the step, stopping.StopRequested, among them). Every change either side waits for is
    notified on `changed`."""

    def __init__(self, loop, last_version: int, torch_threads: int | None):
        super().__init__(name="rft-explorer", daemon=True)
        self.loop = loop
        self.last_version = last_version
        self.torch_threads = torch_threads
        self.changed = threading.Condition()
        self.allowed_version = loop.sync.latest_version()
        self.stopped = False  # no explorer step starts any more
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.torch_threads:
                torch.set_num_threads(self.torch_threads)  # this thread's own OpenMP pool
            while self.wait_for_next_step():
                self.loop.explore()
                with self.changed:
                    self.changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the trainer's thread
            self.error = exc
        finally:
            with self.changed:
                self.stopped = True
                self.changed.notify_all()
            if self.loop.stores.thread_finished is not None:
                self.loop.stores.thread_finished()

    def wait_for_next_step(self) -> bool:
        """True once the next explorer step may start, False when the thread is to end."""
        sync, explorer = self.loop.sync, self.loop.explorer
        with self.changed:
            needed = sync.required_version(explorer.step)
            if self.allowed_version < needed <= self.last_version:
                self.loop.activity.doing("explorer", f"waiting for the trainer's v{needed} "
                                                     f"(explorer step {explorer.step + 1})")
            self.changed.wait_for(
                lambda: self.stopped
                or not self.allowed_version < sync.required_version(explorer.step) <= self.last_version
            )
            return not self.stopped and sync.required_version(explorer.step) <= self.last_version

    def allow(self, version: int) -> None:
        with self.changed:
            self.allowed_version = version
            self.changed.notify_all()

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait in the trainer's thread until ready() or the explorer ended; raise its error."""
        with self.changed:
            self.changed.wait_for(lambda: self.stopped or ready())
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        """Run the explorer steps already allowed, then end; raise the explorer's error."""
        with self.changed:
            self.last_version = min(self.last_version, self.allowed_version)
            self.changed.notify_all()
        self.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Start no more explorer steps; return once the one running (if any) is done."""
        with self.changed:
            self.stopped = True
            self.changed.notify_all()
        self.join()
