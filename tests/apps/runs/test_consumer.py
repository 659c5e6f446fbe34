"""The run websocket through the real ASGI app (auth, origin check, routing) and the Redis channel layer."""
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import OperationalError, transaction

from apps.runs import services
from apps.runs.models import MetricPoint, Run
from rftweb.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(client, user) -> bytes:
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def connect(path, cookie=b"", origin=b"http://localhost"):
    headers = [(b"host", b"localhost"), (b"origin", origin)] + ([(b"cookie", cookie)] if cookie else [])
    return WebsocketCommunicator(application, path, headers=headers)


def test_channel_layer_is_redis():
    assert type(get_channel_layer()).__name__ == "RedisChannelLayer"


def test_researcher_receives_updates_sent_after_commit(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)

    async def scenario():
        ws = connect(f"/ws/runs/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"type": "ping"})
        assert await ws.receive_json_from(timeout=5) == {"type": "pong", "seq": 0}  # the newest message's number
        await database_sync_to_async(services.record_metrics)(run, "trainer", 1, {"loss": 0.5})
        message = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return message

    message = async_to_sync(scenario)()
    recorded = MetricPoint.objects.get(run=run).time.timestamp()
    assert message == {
        "type": "updates",
        "seq": 1,
        "updates": [{"type": "metrics", "role": "trainer", "step": 1, "values": {"loss": 0.5},
                     "time": round(recorded, 3)}],  # when it was recorded: the charts' time axes
    }


def test_updates_are_numbered_in_order_and_coalesced(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)

    def train_steps(first, last):
        for step in range(first, last + 1):
            services.record_metrics(run, "trainer", step, {"loss": 1 / step})

    async def scenario():
        ws = connect(f"/ws/runs/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        await database_sync_to_async(train_steps)(1, 60)
        messages = []
        while sum(len(m["updates"]) for m in messages) < 60:
            messages.append(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        return messages

    messages = async_to_sync(scenario)()
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    steps = [u["step"] for m in messages for u in m["updates"]]
    assert steps == list(range(1, 61))
    assert len(messages) < 60  # 60 steps went out in a few messages


def test_rolled_back_metrics_are_never_broadcast(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)

    def record_then_roll_back():
        with pytest.raises(RuntimeError), transaction.atomic():
            services.record_metrics(run, "trainer", 1, {"loss": 0.5})
            raise RuntimeError("rolled back")

    async def scenario():
        ws = connect(f"/ws/runs/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        await database_sync_to_async(record_then_roll_back)()
        silent = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return silent

    assert async_to_sync(scenario)()


@pytest.mark.parametrize("who", ["anonymous", "annotator"])
def test_anonymous_and_annotators_are_refused(client, researcher, annotator, who):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, annotator) if who == "annotator" else b""

    async def scenario():
        connected, code = await connect(f"/ws/runs/{run.pk}/", cookie).connect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert not connected and code == 4403


def test_foreign_origin_is_refused(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})

    cookie = session_cookie(client, researcher)

    async def scenario():
        return await connect(f"/ws/runs/{run.pk}/", cookie, b"http://evil.example").connect()

    connected, _ = async_to_sync(scenario)()
    assert not connected


def test_unknown_messages_get_an_error(client, researcher):
    run = Run.objects.create(name="r", owner=researcher, config={})

    cookie = session_cookie(client, researcher)

    async def scenario():
        ws = connect(f"/ws/runs/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        await ws.send_to(text_data="not json at all")
        first = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first

    assert async_to_sync(scenario)()["type"] == "error"


def test_an_update_after_a_quiet_spell_goes_out_at_once_and_the_next_ones_wait_for_the_window(researcher):
    """apps/runs/live.py: a window of 2 s here, so "at once" and "after the window" are far apart."""
    import time

    from apps.runs.consumers import run_group
    from apps.runs.live import LivePublisher

    run = Run.objects.create(name="r", owner=researcher, config={})
    publisher = LivePublisher(coalesce_seconds=2.0)
    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(run_group(run.pk), channel)
        started = time.monotonic()
        publisher.publish(run.pk, {"step": 1})
        first = await layer.receive(channel)
        first_at = time.monotonic() - started
        publisher.publish(run.pk, {"step": 2})
        publisher.publish(run.pk, {"step": 3})
        second = await layer.receive(channel)
        second_at = time.monotonic() - started
        return first["payload"], first_at, second["payload"], second_at

    first, first_at, second, second_at = async_to_sync(scenario)()
    assert first["updates"] == [{"step": 1}] and first_at < 1.0
    assert second["updates"] == [{"step": 2}, {"step": 3}] and second_at >= 2.0
    assert second["seq"] == first["seq"] + 1


def test_a_deleted_runs_updates_are_dropped_and_the_others_still_go(researcher):
    from apps.runs.consumers import run_group
    from apps.runs.live import LivePublisher

    kept, deleted = (Run.objects.create(name=name, owner=researcher, config={}) for name in "ab")
    publisher = LivePublisher(coalesce_seconds=60)
    publisher.flush()  # a send just now: the next updates wait for the window, here flushed by hand
    publisher.publish(deleted.pk, {"step": 1})
    publisher.publish(kept.pk, {"step": 2})
    Run.objects.filter(pk=deleted.pk).delete()
    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(run_group(kept.pk), channel)
        await database_sync_to_async(publisher.flush)()
        return await layer.receive(channel)

    assert async_to_sync(scenario)()["payload"]["updates"] == [{"step": 2}]


def test_updates_the_database_refused_to_number_go_with_the_next_flush(researcher, monkeypatch):
    from apps.runs import live
    from apps.runs.consumers import run_group

    run = Run.objects.create(name="a", owner=researcher, config={})
    publisher = live.LivePublisher(coalesce_seconds=60)
    publisher.flush()  # a send just now: the updates wait for the window, here flushed by hand
    numbered = live.next_seq
    outage = iter([OperationalError("connection timeout expired")])

    def next_seq(run_id):
        error = next(outage, None)
        if error is not None:
            raise error
        return numbered(run_id)

    monkeypatch.setattr(live, "next_seq", next_seq)
    publisher.publish(run.pk, {"step": 1})
    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(run_group(run.pk), channel)
        await database_sync_to_async(publisher.flush)()  # refused: kept
        publisher.publish(run.pk, {"step": 2})
        await database_sync_to_async(publisher.flush)()
        return await layer.receive(channel)

    message = async_to_sync(scenario)()["payload"]
    assert message["updates"] == [{"step": 1}, {"step": 2}]  # in order, nothing lost
