"""What a loop is doing now, for the run page's duty line ("rolling out step 12 · training step
11", "saving a checkpoint at step 40"): the loop says so as each phase starts; whoever serves it
reads `now()` (supervision's heartbeat writes it on the duty's beat) and may be told of each change
(`on_change`: supervision sends it to the open run pages at once). A line that said only "running
on train@vm" left a stalled step and a long checkpoint looking the same (#42, finding 11).
"""
import threading
import time

EXPLORER, TRAINER = "explorer", "trainer"  # the roles a loop says what it does for


class Activity:
    def __init__(self):
        self._doing: dict[str, tuple[str, float]] = {}  # role -> (what, since: epoch seconds)
        self._lock = threading.Lock()  # the explorer's thread and the trainer's say, the heartbeat reads
        self.on_change = None  # called with now() after each change, on the thread that made it

    def doing(self, role: str, what: str) -> None:
        """`role` ("explorer" or "trainer": a loop runs both at once) starts `what`. Said again
        while it goes on (a wait looks again every half second), it keeps its start: the line then
        says how long it has lasted, and the open pages are told nothing new."""
        with self._lock:
            if self._doing.get(role, (None,))[0] == what:
                return
            self._doing[role] = (what, time.time())
        if self.on_change is not None:
            self.on_change(self.now())

    def now(self) -> list[dict]:
        """[{"role", "what", "since"}], the explorer's first."""
        with self._lock:
            doing = sorted(self._doing.items())
        return [{"role": role, "what": what, "since": since} for role, (what, since) in doing]
