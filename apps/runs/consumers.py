"""The live channel of a run: status and metric updates, pushed after they are committed.

Only researchers (and curators) may watch. Messages are whatever `services.broadcast` sends.
"""
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.accounts.roles import RESEARCHER, has_role


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


MAX_CLIENT_MESSAGE_CHARS = 4096  # a client only ever sends pings; anything bigger is abuse
# The close code for a frame over that: 1009 (message too big) is the protocol's own, but an
# application may only close with 1000 or 3000-4999 (daphne's autobahn refuses 1009 and the
# socket ended with 1011 instead), so it is 4000 + 1009's last digits.
CLOSE_MESSAGE_TOO_BIG = 4009


class PingConsumer(AsyncJsonWebsocketConsumer):
    """A push-only channel: the server sends, the client may only ping (to keep proxies from
    closing an idle socket). Anything else gets an error reply and the socket stays open; a frame
    too big to be a ping closes it (CLOSE_MESSAGE_TOO_BIG, 4009) before it is parsed."""

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if bytes_data is not None:
            await self.send_json({"type": "error", "error": "binary frames are not accepted; send JSON text"})
            return
        if len(text_data or "") > MAX_CLIENT_MESSAGE_CHARS:
            await self.close(code=CLOSE_MESSAGE_TOO_BIG, reason="message too big")
            return
        try:
            content = json.loads(text_data or "")
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
            content = None
        if not isinstance(content, dict) or content.get("type") != "ping":
            await self.send_json({"type": "error", "error": "unknown message; this channel only accepts {\"type\": \"ping\"}"})
            return
        await self.send_json({"type": "pong"})


class RunConsumer(PingConsumer):
    async def connect(self):
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not (user and user.is_authenticated and await self._may_watch(user)):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)

    async def run_update(self, event):
        await self.send_json(event["payload"])

    @database_sync_to_async
    def _may_watch(self, user) -> bool:
        from .models import Run

        return has_role(user, RESEARCHER) and Run.objects.filter(pk=self.run_id).exists()
