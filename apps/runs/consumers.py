"""The live channel of a run: status and metric updates, pushed after they are committed.

Only researchers (and curators) may watch. Messages are whatever `services.broadcast` sends.
"""
from channels.db import database_sync_to_async

from apps.accounts.roles import RESEARCHER, has_role
from apps.core.consumers import PingConsumer


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


class RunConsumer(PingConsumer):
    def live_groups(self):
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        return (run_group(self.run_id),)

    def may_watch(self, user) -> bool:
        from .models import Run

        return has_role(user, RESEARCHER) and Run.objects.filter(pk=self.run_id).exists()

    async def run_update(self, event):
        await self.send_json(event["payload"])

    async def pong(self) -> dict:
        """With the number of the run's newest message: a page whose last message was lost (a run's
        final "stopped", say) has no later number to see the gap by, but sees it here."""
        return {"type": "pong", "seq": await self._live_seq()}

    @database_sync_to_async
    def _live_seq(self) -> int:
        from .models import Run

        return Run.objects.filter(pk=self.run_id).values_list("live_seq", flat=True).first() or 0
