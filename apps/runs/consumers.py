"""The live channel of a run: status and metric updates, pushed after they are committed.

Only researchers (and curators) may watch. Messages are whatever `services.broadcast` sends.
"""
from channels.db import database_sync_to_async

from apps.accounts.roles import RESEARCHER, has_role
from apps.core.consumers import CLOSE_FORBIDDEN, PingConsumer


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


class RunConsumer(PingConsumer):
    async def connect(self):
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not (user and user.is_authenticated and await self._may_watch(user)):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

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

    @database_sync_to_async
    def _may_watch(self, user) -> bool:
        from .models import Run

        return has_role(user, RESEARCHER) and Run.objects.filter(pk=self.run_id).exists()
