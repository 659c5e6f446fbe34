"""The annotation websocket through the real ASGI app (auth, origin check, routing) and Redis."""
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from apps.feedback import queue, services
from apps.runs import services as run_services
from rftweb.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(client, user) -> bytes:
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def connect(path, cookie=b""):
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost")] + ([(b"cookie", cookie)] if cookie else [])
    return WebsocketCommunicator(application, path, headers=headers)


def test_annotators_hear_items_taken_judged_new_experiences_and_the_run_finishing(
    client, make_experience, make_annotator, run
):
    watcher, worker = make_annotator("watcher"), make_annotator("worker")
    experience = make_experience()
    cookie = session_cookie(client, watcher)

    async def scenario():
        ws = connect(f"/ws/annotate/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        await ws.send_json_to({"type": "ping"})
        heard = [await ws.receive_json_from(timeout=5)]
        await database_sync_to_async(queue.next_item)(run, worker)
        heard.append(await ws.receive_json_from(timeout=5))
        await database_sync_to_async(services.rate)(experience.pk, worker, "3")
        heard.append(await ws.receive_json_from(timeout=5))
        await database_sync_to_async(run_services.set_progress)(run, explorer_step=7)
        heard.append(await ws.receive_json_from(timeout=5))
        await database_sync_to_async(run_services.set_status)(run, "failed", error="boom")
        heard.append(await ws.receive_json_from(timeout=5))
        await ws.disconnect()
        return heard

    assert async_to_sync(scenario)() == [
        {"type": "pong"},
        {"type": "taken", "experience": experience.pk, "user": "worker", "places_left": 0},
        {"type": "judged", "experience": experience.pk, "user": "worker"},
        {"type": "new_experiences", "explorer_step": 7},
        {"type": "run_status", "status": "failed"},
    ]


def test_a_refused_judgement_is_never_broadcast(client, make_experience, make_annotator, run):
    watcher = make_annotator("watcher")
    experience = make_experience()
    cookie = session_cookie(client, watcher)

    async def scenario():
        ws = connect(f"/ws/annotate/{run.pk}/", cookie)
        assert (await ws.connect())[0]
        with pytest.raises(services.FeedbackError):
            await database_sync_to_async(services.rate)(experience.pk, watcher, "11")
        silent = await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return silent

    assert async_to_sync(scenario)()


def test_anonymous_users_are_refused(run):
    async def scenario():
        return await connect(f"/ws/annotate/{run.pk}/").connect()

    connected, code = async_to_sync(scenario)()
    assert not connected and code == 4403
