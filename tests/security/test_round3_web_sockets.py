"""Issue #30, low findings 11 and 14 (websockets), through the real ASGI app and the Redis layer.

11: a socket is closed (4401) when its user loses access, and hears nothing more: a logout (that
browser's sockets alone), a password change (the browser that made it and any other),
deactivation, a role removed, removal from a run's annotators. The page reconnects after 4401,
and only a session that still may watch is let in again. 14: another user's job is refused as a
missing one is (the frame limit under daphne is in test_round3_web_server.py)."""
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import ANNOTATOR, RESEARCHER
from apps.accounts.services import create_user
from apps.feedback import services as feedback_services
from apps.runs import services as run_services
from apps.runs.models import Run
from apps.tasksets.models import TasksetImport
from rftweb.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users
NEW_PASSWORD = "a-new-passphrase-456"
CLOSED = {"type": "websocket.close", "code": 4401}


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def socket(client: Client, path: str) -> WebsocketCommunicator:
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    return WebsocketCommunicator(application, path, headers=headers)


async def closed_and_silent_after(ws, push) -> bool:
    """Whether the socket is closed with 4401 and then hears nothing of `push` (run in a thread)."""
    closed = await ws.receive_output(timeout=5)
    await database_sync_to_async(push)()
    return closed == CLOSED and await ws.receive_nothing(timeout=1.5)


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.RUNNING)


def test_run_sockets_opened_before_a_password_change_are_closed_after_it(researcher, run):
    browser, other_browser = logged_in(researcher), logged_in(researcher)
    here, elsewhere = socket(browser, f"/ws/runs/{run.pk}/"), socket(other_browser, f"/ws/runs/{run.pk}/")

    def change_password():
        response = browser.post(
            reverse("password_change"),
            {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
        )
        assert response.status_code == 302

    async def scenario():
        assert (await here.connect())[0] and (await elsewhere.connect())[0]
        await database_sync_to_async(change_password)()
        closed = [
            await closed_and_silent_after(ws, lambda: run_services.record_metrics(run, "trainer", 1, {"loss": 0.5}))
            for ws in (here, elsewhere)
        ]
        # The browser that changed it is still logged in (a new session), and opens a new socket.
        again = socket(browser, f"/ws/runs/{run.pk}/")
        connected, _ = await again.connect()
        await again.disconnect()
        return closed, connected

    assert async_to_sync(scenario)() == ([True, True], True)


def test_a_logout_closes_that_browsers_sockets_and_no_others(researcher, run):
    """A socket outlived its session's logout and went on hearing the run (a review found it)."""
    leaving, staying = logged_in(researcher), logged_in(researcher)
    left_ws, stayed_ws = socket(leaving, f"/ws/runs/{run.pk}/"), socket(staying, f"/ws/runs/{run.pk}/")

    def log_out():
        assert leaving.post(reverse("logout")).status_code == 302

    async def scenario():
        assert (await left_ws.connect())[0] and (await stayed_ws.connect())[0]
        await database_sync_to_async(log_out)()
        silent = await closed_and_silent_after(left_ws, lambda: run_services.set_progress(run, explorer_step=5))
        heard = await stayed_ws.receive_json_from(timeout=5)
        await stayed_ws.disconnect()
        return silent, heard["type"]

    assert async_to_sync(scenario)() == (True, "updates")


def test_a_logouts_check_is_sent_once_its_session_is_gone(researcher, monkeypatch):
    """Django sends user_logged_out before it flushes the session; a check sent at once found the
    session still there, and the socket stayed open (a race the scenario above, whose consumer
    waits for the logout's thread, cannot lose). At the moment the check goes, the store must no
    longer hold the session."""
    from importlib import import_module

    from apps.accounts import revocation

    browser = logged_in(researcher)
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value
    store = import_module(settings.SESSION_ENGINE).SessionStore
    held_when_sent = []
    monkeypatch.setattr(revocation, "recheck", lambda group: held_when_sent.append(store().exists(key)))
    assert store().exists(key)
    assert browser.post(reverse("logout")).status_code == 302
    assert held_when_sent == [False]


def deactivate(user):
    user.is_active = False
    user.save()


def remove_role(user):
    user.groups.remove(Group.objects.get(name=RESEARCHER))


@pytest.mark.parametrize("revoke", [deactivate, remove_role], ids=["deactivated", "role-removed"])
def test_a_user_who_loses_access_is_closed_and_hears_nothing_more(researcher, run, revoke):
    browser = logged_in(researcher)
    ws = socket(browser, f"/ws/runs/{run.pk}/")

    async def scenario():
        assert (await ws.connect())[0]
        await database_sync_to_async(revoke)(researcher)
        silent = await closed_and_silent_after(ws, lambda: run_services.set_progress(run, explorer_step=3))
        return silent, await socket(browser, f"/ws/runs/{run.pk}/").connect()  # the page reconnects

    assert async_to_sync(scenario)() == (True, (False, 4403))


def test_an_annotator_removed_from_a_run_stops_hearing_new_experiences(researcher, run):
    kept, removed = (create_user(name, PASSWORD, roles=[ANNOTATOR]) for name in ("kept", "removed"))
    feedback_services.set_annotators(run, researcher, open_to_all=False, usernames=["kept", "removed"])
    path = f"/ws/annotate/{run.pk}/"
    removed_browser = logged_in(removed)
    kept_ws, removed_ws = socket(logged_in(kept), path), socket(removed_browser, path)
    owner = logged_in(researcher)

    def remove():  # through the run's feedback page, as its owner does
        response = owner.post(reverse("annotate-assign", args=[run.pk]), {"usernames": "kept"})
        assert response.status_code == 302

    async def scenario():
        assert (await kept_ws.connect())[0] and (await removed_ws.connect())[0]
        await database_sync_to_async(remove)()
        removed_silent = await closed_and_silent_after(
            removed_ws, lambda: run_services.set_progress(run, explorer_step=7)
        )
        heard = await kept_ws.receive_json_from(timeout=5)
        await kept_ws.disconnect()
        return removed_silent, await socket(removed_browser, path).connect(), heard

    assert async_to_sync(scenario)() == (True, (False, 4403), {"type": "new_experiences", "explorer_step": 7})


def test_another_users_job_is_refused_as_a_missing_one(researcher):
    other = create_user("other", PASSWORD, roles=[RESEARCHER])
    job = TasksetImport.objects.create(original_filename="x.jsonl", name="x", format="jsonl", created_by=researcher)
    client = logged_in(other)
    ids = (job.pk, job.pk + 99)  # another's job, and none
    assert [client.get(reverse("job-progress", args=["tasksets.tasksetimport", pk])).status_code for pk in ids] == [
        404, 404
    ]

    async def close_codes():
        return [
            await socket(client, f"/ws/jobs/tasksets.tasksetimport/{pk}/").connect() for pk in ids
        ]

    assert async_to_sync(close_codes)() == [(False, 4403), (False, 4403)]
