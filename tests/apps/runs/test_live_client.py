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


def record(run, *steps):
    for step in steps:
        services.record_metrics(run, "trainer", step, {"loss": 1 / step})


def test_a_client_following_the_numbers_ends_where_the_database_is(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    client.force_login(researcher)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    record(run, 1, 2, 3)
    publisher.flush()  # these went out before the page opened: no one was listening

    async def scenario():
        live = LiveClient(lambda: sync_to_async(lambda: client.get(reverse("run-live", args=[run.pk])).json())())
        ws = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/", headers=[(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
        )
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
