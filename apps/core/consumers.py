"""The websocket base of every channel (PingConsumer), a job's live channel (JobConsumer), and
the answer to a path no channel serves (UnknownPathConsumer)."""
import json
import logging

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from apps.accounts.revocation import session_user, user_group

from .jobs import job_group, visible_job

MAX_CLIENT_MESSAGE_CHARS = 4096  # a client only ever sends pings; anything bigger is abuse
# The close code for a frame over that: 1009 (message too big) is the protocol's own, but an
# application may only close with 1000 or 3000-4999 (daphne's autobahn refuses 1009 and the
# socket ended with 1011 instead), so it is 4000 + 1009's last digits. A frame over the server's
# own limit is closed with it too (rftweb.asgi).
CLOSE_MESSAGE_TOO_BIG = 4009
CLOSE_FORBIDDEN = 4403  # not allowed to watch: the page does not retry
# Closed because the user's access changed (apps.accounts.revocation). The page reconnects, as
# after any close but 4403, and its handshake decides: a browser whose session still holds (the
# one that changed the password) watches on; a user who lost access is refused with 4403.
CLOSE_ACCESS_CHANGED = 4401
CLOSE_NOT_FOUND = 4404  # no channel at the socket's path
SHOWN_PATH_CHARS = 200  # of an unknown path, in the log: the client chose it

logger = logging.getLogger(__name__)


class PingConsumer(AsyncJsonWebsocketConsumer):
    """A push-only channel: the server sends, the client may only ping (to keep proxies from
    closing an idle socket). Anything else gets an error reply and the socket stays open; a frame
    too big to be a ping closes it (CLOSE_MESSAGE_TOO_BIG, 4009) before it is parsed.

    A subclass names the groups it listens to (`live_groups`) and who may listen (`may_watch`).
    The socket also joins its user's group, and checks `may_watch` again whenever it hears
    `access.check` there or in its own groups (apps.accounts.revocation): a socket whose user
    lost access is closed with CLOSE_ACCESS_CHANGED and hears nothing more."""

    def live_groups(self) -> tuple[str, ...]:
        raise NotImplementedError

    def may_watch(self, user) -> bool:
        """Whether `user` may listen (called in a thread, with database access)."""
        raise NotImplementedError

    async def connect(self):
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        # Joined before the check: a revocation that commits between the two is still heard.
        self.joined = (*self.live_groups(), user_group(user.pk))
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        if not await self.allowed():
            await self.leave()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.accept()

    async def disconnect(self, code):
        await self.leave()

    async def leave(self):
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = ()

    async def access_check(self, event):
        if not await self.allowed():
            await self.leave()
            await self.close(code=CLOSE_ACCESS_CHANGED)
            raise StopConsumer  # handle nothing more that was already on its way to this socket

    async def allowed(self) -> bool:
        user = await session_user(self.scope["session"].session_key)
        return user is not None and await database_sync_to_async(self.may_watch)(user)

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
    the job (its model's may_view); another user's job is refused as a missing one is."""

    def live_groups(self):
        kwargs = self.scope["url_route"]["kwargs"]
        return (job_group(kwargs["label"], int(kwargs["job_id"])),)

    def may_watch(self, user) -> bool:
        kwargs = self.scope["url_route"]["kwargs"]
        return visible_job(kwargs["label"], int(kwargs["job_id"]), user) is not None

    async def job_update(self, event):
        await self.send_json({"type": "job", "job": event["payload"]})


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """A socket to a path no channel serves (routed last, rftweb.asgi). channels' URLRouter
    raised ValueError for it: daphne answered the handshake with a 500 and logged a traceback.
    Here it is accepted and closed with CLOSE_NOT_FOUND, and the log has one line."""

    async def connect(self):
        path = self.scope.get("path", "")
        logger.info("websocket to unknown path %r closed with %d", path[:SHOWN_PATH_CHARS], CLOSE_NOT_FOUND)
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
