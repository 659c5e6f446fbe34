"""The server side of the live client's contract (static/js/live.js), through the real ASGI app.

LiveClient below applies the same rule as LiveRun.receive: apply seq N right after N-1, ignore
older numbers, refetch the snapshot on a gap. Driving it against live.json and the websocket shows
that the snapshot's seq and the message numbers fit together, so the page converges on what the
database holds even when a message is lost.
"""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.urls import reverse

from apps.runs import services
from apps.runs.live import next_seq, publisher
from apps.runs.models import Run
from rftweb.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


class LiveClient:
    def __init__(self, fetch_snapshot):
        self.fetch_snapshot = fetch_snapshot
        self.seq = None
        self.steps: dict[str, list[int]] = {}
        self.snapshots = 0

    async def load(self):
        snapshot = await self.fetch_snapshot()
        self.seq = snapshot["seq"]
        self.steps = {role: [point["step"] for point in points] for role, points in snapshot["metrics"].items()}
        self.snapshots += 1

    async def receive(self, message) -> str:
        if message["type"] == "pong":
            if message["seq"] > self.seq:  # behind, with nothing more on its way
                await self.load()
                return "behind"
            return "ignored"
        if message["seq"] <= self.seq:
            return "ignored"
        if message["seq"] > self.seq + 1:
            await self.load()
            return "gap" if message["seq"] <= self.seq else await self.receive(message)
        self.seq = message["seq"]
        for update in message["updates"]:
            if update["type"] == "metrics":
                self.steps.setdefault(update["role"], []).append(update["step"])
        return "applied"


def session_cookie(client, researcher) -> bytes:
    client.force_login(researcher)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def watch(client, run, cookie) -> tuple[LiveClient, WebsocketCommunicator]:
    """The run page's two sources: its snapshot (live.json) and its websocket (connect it)."""
    live = LiveClient(lambda: sync_to_async(lambda: client.get(reverse("run-live", args=[run.pk])).json())())
    ws = WebsocketCommunicator(
        application, f"/ws/runs/{run.pk}/",
        headers=[(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)],
    )
    return live, ws


def record(run, *steps):
    for step in steps:
        services.record_metrics(run, "trainer", step, {"loss": 1 / step})


def test_a_client_following_the_numbers_ends_where_the_database_is(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)
    record(run, 1, 2, 3)
    publisher.flush()  # these went out before the page opened: no one was listening

    async def scenario():
        live, ws = watch(client, run, cookie)
        assert (await ws.connect())[0]
        await live.load()
        assert live.steps == {"trainer": [1, 2, 3]}

        await database_sync_to_async(record)(run, 4, 5)
        assert await live.receive(await ws.receive_json_from(timeout=5)) == "applied"

        await database_sync_to_async(next_seq)(run.pk)  # a message Channels dropped on the way
        await database_sync_to_async(record)(run, 6)
        outcome = await live.receive(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        return live, outcome

    live, outcome = async_to_sync(scenario)()
    assert outcome == "gap" and live.snapshots == 2
    assert live.steps == {"trainer": [1, 2, 3, 4, 5, 6]}
    assert live.seq == Run.objects.get(pk=run.pk).live_seq


def test_a_lost_last_message_is_found_by_the_next_pong(client, researcher):
    """A run's final message (its "stopped", say) has no later number to show the gap by: the
    pong the page asks for every few seconds carries the newest number instead."""
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)

    async def scenario():
        live, ws = watch(client, run, cookie)
        assert (await ws.connect())[0]
        await live.load()
        await ws.send_json_to({"type": "ping"})
        first = await live.receive(await ws.receive_json_from(timeout=5))

        await database_sync_to_async(record)(run, 1)
        lost = await ws.receive_json_from(timeout=5)  # as if Channels had dropped it on the way
        await ws.send_json_to({"type": "ping"})
        second = await live.receive(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        return live, lost, first, second

    live, lost, first, second = async_to_sync(scenario)()
    assert lost["type"] == "updates" and (first, second) == ("ignored", "behind")
    assert live.steps == {"trainer": [1]} and live.seq == Run.objects.get(pk=run.pk).live_seq
