"""What a loop is doing now, for the run page's duty line ("rolling out step 12 · training step
11", "saving a checkpoint at step 40"): the loop says so as each phase starts; whoever serves it
reads `now()` (supervision's heartbeat writes it on the duty's beat). A line that said only
"running on train@vm" left a stalled step and a long checkpoint looking the same (#42, finding 11).
"""
import time


class Activity:
    def __init__(self):
        self._doing: dict[str, tuple[str, float]] = {}  # role -> (what, since: epoch seconds)

    def doing(self, role: str, what: str) -> None:
        """`role` ("explorer" or "trainer": a loop runs both at once) starts `what`."""
        self._doing[role] = (what, time.time())

    def now(self) -> list[dict]:
        """[{"role", "what", "since"}], the explorer's first."""
        return [{"role": role, "what": what, "since": since} for role, (what, since) in sorted(self._doing.items())]
