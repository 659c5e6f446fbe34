"""The websocket base of every channel (PingConsumer), and a job's live channel (JobConsumer)."""
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .jobs import find_job, job_group

MAX_CLIENT_MESSAGE_CHARS = 4096  # a client only ever sends pings; anything bigger is abuse
# The close code for a frame over that: 1009 (message too big) is the protocol's own, but an
# application may only close with 1000 or 3000-4999 (daphne's autobahn refuses 1009 and the
# socket ended with 1011 instead), so it is 4000 + 1009's last digits.
CLOSE_MESSAGE_TOO_BIG = 4009
CLOSE_FORBIDDEN = 4403  # not allowed to watch: the page does not retry


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
            await self.send_json(
                {"type": "error", "error": "unknown message; this channel only accepts {\"type\": \"ping\"}"}
            )
            return
        await self.send_json(await self.pong())

    async def pong(self) -> dict:
        """The reply to a ping."""
        return {"type": "pong"}


class JobConsumer(PingConsumer):
    """A job's state as it changes ({"type": "job", "job": jobs.snapshot}), for whoever may see
    the job (its model's may_view)."""

    async def connect(self):
        kwargs = self.scope["url_route"]["kwargs"]
        self.group = job_group(kwargs["label"], int(kwargs["job_id"]))
        user = self.scope.get("user")
        if not (user and user.is_authenticated and await self._may_view(user, kwargs)):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def job_update(self, event):
        await self.send_json({"type": "job", "job": event["payload"]})

    @database_sync_to_async
    def _may_view(self, user, kwargs) -> bool:
        job = find_job(kwargs["label"], int(kwargs["job_id"]))
        return job is not None and job.may_view(user)

