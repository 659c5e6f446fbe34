"""A run's Stop reaching the long loops inside a step: an explorer's, and a trainer's wait for ratings.

The loop asks `should_stop()` between steps, but one step may run for minutes: a judge scoring
two 120,000-character prompts held a worker for 1,725 s, and Stop waited for it. The engine knows
nothing of runs or databases, so whoever runs a step hands its should_stop in (`stoppable`, around
Explorer.explore_step and .evaluate), and every loop that can run long calls `check()` once a
round: the decode loop once a token, a judge or reward model once a batch, a workflow once a
prompt it encodes (a task pipeline's pass over a taskset included). `check()` asks should_stop()
at most every CHECK_EVERY_S seconds, since a duty's answer is a database read, and raises
StopRequested once it says stop. The step is then abandoned before it stores anything (the
explorer writes a step's rollouts at its end), and the loop ends the run as a stop between steps
does; a resumed run replays that step.

The trainer's step is stoppable too (Loop.train): its wait for ratings (feedback.rating_wait_s,
up to an hour) checks once a poll of the buffer, and a stop there raises before the step samples anything, so
no step is counted. Outside `stoppable` (a buffer job, a test) `check()` does nothing. The check
lives in a context variable: each thread sees its own, so an embedded server's runs, threads of
one process that share a cached judge, each stop for their own run alone.
"""
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# How often a long loop asks should_stop(). A stop then ends the step within this plus one round
# of the loop (a token, a batch of 16 scored sequences: well under a second with the bounded
# inputs on the 2-core box), against the 30 s Stop is promised in.
CHECK_EVERY_S = 2.0


class StopRequested(Exception):
    """The run was told to stop (or its worker to leave) in the middle of a step: an explorer's, or
    a trainer's wait for ratings."""


class _Check:
    def __init__(self, should_stop: Callable[[], bool]):
        self.should_stop, self.every_s = should_stop, CHECK_EVERY_S
        self.next_at = time.monotonic() + self.every_s  # the loop has just asked, before the step

    def __call__(self) -> None:
        if time.monotonic() < self.next_at:
            return
        stop = self.should_stop()
        self.next_at = time.monotonic() + self.every_s  # after: a paused run's should_stop waits in it
        if stop:
            raise StopRequested("the run was told to stop during a step")


_current: ContextVar[_Check | None] = ContextVar("rft_stop_check", default=None)


@contextmanager
def stoppable(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within it, check() in this thread asks should_stop() (None: never)."""
    token = _current.set(None if should_stop is None else _Check(should_stop))
    try:
        yield
    finally:
        _current.reset(token)


def check() -> None:
    """StopRequested if the step this thread runs is to stop; near free between asks."""
    current = _current.get()
    if current is not None:
        current()
