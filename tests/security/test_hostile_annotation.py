"""Hostile input on the annotation routes and the websockets (issue #20, findings 2, 5, 6 and 7):
an annotator not assigned to a run gets a 403 and nothing of it on every route; NULs, overlong
comments and non-numeric times are refused or made harmless, never a 500; a frame too big closes
the socket with 4009; a socket is accepted only from this server's own origin (scheme, host, port)."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from apps.accounts.roles import ANNOTATOR, RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.core.consumers import CLOSE_MESSAGE_TOO_BIG, MAX_CLIENT_MESSAGE_CHARS
from apps.feedback import queue, services
from apps.feedback.models import AnnotationLock, Feedback, SetAside
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from rftweb.asgi import application
from tests.support import daphne_command, service_env, websocket_connects

PROMPT, RESPONSE, OTHER_RESPONSE = "secret prompt 7431", "secret response 7431", "secret other response 7431"
JUDGEMENT_FORMS = {
    "annotate-rate": {"point": "3"},
    "annotate-edit": {"text": "a better answer"},
    "annotate-compare": {"verdict": "a_better"},  # "other" is filled in with the second response
    "annotate-flag": {"reason": "garbled"},
}


class World:
    """A run restricted to one annotator (`chosen`), two responses to one prompt, an outsider."""


@pytest.fixture
def world(db):
    o = World()
    o.owner = create_user("owner", "pw-for-tests-123", roles=(RESEARCHER,))
    o.chosen = create_user("chosen", "pw-for-tests-123", roles=(ANNOTATOR,))
    o.outsider = create_user("outsider", "pw-for-tests-123", roles=(ANNOTATOR,))
    o.run = Run.objects.create(name="r", owner=o.owner, config={}, status=Run.Status.RUNNING)
    task = Task.objects.create(taskset=Taskset.objects.create(name="ts"), index=0, prompt=PROMPT, answer="2")
    o.item, o.other = (
        Experience.objects.create(
            run=o.run, task=task, explorer_step=0, rollout_index=i, group_id="g0", prompt_text=PROMPT,
            response_text=text, prompt_ids=[1], response_ids=[2], action_mask=[1], logprobs=[-0.1], reward=1.0,
            model_version=1,
        )
        for i, text in enumerate((RESPONSE, OTHER_RESPONSE))
    )
    services.set_annotators(o.run, o.owner, open_to_all=False, usernames=["chosen"])
    return o


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def nothing_stored() -> bool:
    return not (Feedback.objects.exists() or SetAside.objects.exists() or AnnotationLock.objects.exists())


def assert_refused(response):
    assert response.status_code == 403, response.status_code
    body = response.content.decode()
    assert "you are not an annotator of run &#x27;r&#x27;" in body
    for text in (PROMPT, RESPONSE, OTHER_RESPONSE):
        assert text not in body


# ---- finding 2: a run restricted to named annotators ---------------------------------------------


@pytest.mark.django_db
def test_an_outsider_cannot_read_an_item_of_a_restricted_run(world):
    assert_refused(client_of(world.outsider).get(reverse("annotate-experience", args=[world.item.pk])))
    assert nothing_stored()
    # The assigned annotator reads it, and holds it.
    response = client_of(world.chosen).get(reverse("annotate-experience", args=[world.item.pk]))
    assert response.status_code == 200 and RESPONSE in response.content.decode()
    assert AnnotationLock.objects.filter(user=world.chosen, experience=world.item).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("route", ["annotate-skip", "annotate-postpone", *JUDGEMENT_FORMS])
def test_an_outsider_cannot_skip_postpone_or_judge(world, route):
    data = {**JUDGEMENT_FORMS.get(route, {}), "other": world.other.pk, "comment": "hi", "shown_at": time.time()}
    assert_refused(client_of(world.outsider).post(reverse(route, args=[world.item.pk]), data))
    assert nothing_stored()


@pytest.mark.django_db
def test_every_service_refuses_an_outsider_before_anything_else(world):
    o, outsider = world, world.outsider
    calls = {
        "take": lambda: queue.take(o.item.pk, outsider),
        "skip": lambda: queue.set_aside(o.item.pk, outsider, postpone=False),
        "postpone": lambda: queue.set_aside(o.item.pk, outsider, postpone=True),
        "rate": lambda: services.rate(o.item.pk, outsider, "not on the scale"),
        "edit": lambda: services.edit(o.item.pk, outsider, RESPONSE),
        "compare": lambda: services.compare(o.item.pk, o.other.pk, outsider, "tie"),
        "flag": lambda: services.flag(o.item.pk, outsider, "wrong"),
        "next": lambda: queue.next_item(o.run, outsider),
    }
    for call in calls.values():
        with pytest.raises(services.NotAnnotator, match="not an annotator of run 'r'"):
            call()
    assert nothing_stored()


# ---- findings 5 and 7: what an annotator types ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "route, data, error",
    [
        # The item page names it, the edit kept (the middleware's plain 400 had lost it).
        ("annotate-edit", {"text": "a better\x00 answer"}, "the edited response must not contain a NUL character"),
        ("annotate-rate", {"point": "3", "comment": "nul\x00here"}, "the comment must not contain a NUL character"),
        ("annotate-flag", {"reason": "wrong", "comment": "x" * (services.MAX_COMMENT_CHARS + 1)},
         f"the comment is {services.MAX_COMMENT_CHARS + 1} characters long; at most {services.MAX_COMMENT_CHARS}"),
        ("annotate-compare", {"verdict": "tie", "comment": "x" * 1_000_000}, "the comment is 1000000 characters long"),
    ],
)
def test_a_nul_or_an_overlong_comment_is_a_400_naming_it_and_stores_nothing(world, route, data, error):
    client = client_of(world.chosen)
    client.get(reverse("annotate-experience", args=[world.item.pk]))  # holds the item, as the page does
    response = client.post(reverse(route, args=[world.item.pk]), {**data, "other": world.other.pk})
    assert response.status_code == 400
    assert error in response.content.decode() and data.get("text", "") in response.content.decode()
    assert not Feedback.objects.exists() and not Experience.objects.filter(source=Experience.Source.HUMAN_EDIT).exists()
    assert Experience.objects.get(pk=world.item.pk).status == world.item.status


@pytest.mark.django_db
def test_a_comment_at_the_limit_is_stored(world):
    comment = "x" * services.MAX_COMMENT_CHARS
    response = client_of(world.chosen).post(
        reverse("annotate-rate", args=[world.item.pk]), {"point": "3", "comment": comment}
    )
    assert response.status_code == 302
    assert Feedback.objects.get().comment == comment


@pytest.mark.django_db
@pytest.mark.parametrize("shown_at, spent", [("nan", 0.0), ("inf", 0.0), ("-inf", 0.0),
                                              ("1e308", 0.0), ("banana", 0.0)])
def test_the_time_spent_is_always_finite_and_bounded(world, shown_at, spent):
    response = client_of(world.chosen).post(
        reverse("annotate-rate", args=[world.item.pk]), {"point": "3", "shown_at": shown_at}
    )
    assert response.status_code == 302
    assert Feedback.objects.get().seconds_spent == spent


# ---- the annotation routes under fuzz ------------------------------------------------------------

form_text = st.one_of(st.text(max_size=60), st.sampled_from(["nan", "inf", "-1", "1e999", "\x00", "3", "tie", "wrong"]))
forms = st.fixed_dictionaries(
    {}, optional={key: form_text for key in ("point", "text", "verdict", "reason", "other", "comment", "shown_at")}
)
ROUTES = ["annotate-experience", "annotate-skip", "annotate-postpone", *JUDGEMENT_FORMS]


@pytest.mark.slow
@hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    route=st.sampled_from(ROUTES),
    who=st.sampled_from(["chosen", "outsider"]),
    offset=st.sampled_from([0, 0, 1, 10**6]),
    form=forms,
)
def test_the_annotation_routes_answer_anything_without_a_500(world, route, who, offset, form):
    """Whatever a form holds: no 500; an outsider gets a 403 (or 404) and nothing is stored."""
    stored_before = (Feedback.objects.count(), SetAside.objects.count(), Experience.objects.count())
    client = client_of(getattr(world, who))
    url = reverse(route, args=[world.item.pk + offset])
    response = client.get(url) if route == "annotate-experience" else client.post(url, form)
    assert response.status_code in (200, 302, 400, 403, 404), response.status_code
    if who == "outsider":  # 400: a NUL is refused before access is checked, and says nothing of the item
        assert response.status_code in (400, 403, 404)
        assert (Feedback.objects.count(), SetAside.objects.count(), Experience.objects.count()) == stored_before
    for row in Feedback.objects.all():
        assert 0.0 <= row.seconds_spent <= services.MAX_SECONDS_SPENT
        assert len(row.comment) <= services.MAX_COMMENT_CHARS and "\x00" not in row.comment + row.edited_text


# ---- finding 6: websockets, over the real ASGI app -----------------------------------------------


def session_cookie(user) -> bytes:
    session = client_of(user).cookies[django_settings.SESSION_COOKIE_NAME].value
    return f"{django_settings.SESSION_COOKIE_NAME}={session}".encode()


def ws_accepts(o, host: bytes, origin: bytes, extra=()) -> bool:
    headers = [(b"host", host), (b"origin", origin), (b"cookie", session_cookie(o.chosen)), *extra]
    return websocket_connects(f"/ws/annotate/{o.run.pk}/", headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "host, origin, accepted",
    [
        (b"127.0.0.1:8000", b"http://127.0.0.1:8000", True),
        (b"localhost", b"http://localhost", True),
        (b"localhost", b"http://localhost:80", True),
        (b"127.0.0.1:8000", b"http://127.0.0.1:9999", False),  # another port
        (b"127.0.0.1:8000", b"https://127.0.0.1:8000", False),  # another scheme
        (b"localhost", b"https://localhost", False),
        (b"127.0.0.1:8000", b"http://localhost:8000", False),  # another (allowed) host
        (b"evil.example", b"http://evil.example", False),  # same origin, but not an allowed host
        (b"localhost", b"http://localhost/", False),
        (b"localhost", b"http://user@localhost", False),
        (b"localhost", b"http://localhost:99999", False),
        (b"", b"http://localhost", False),
    ],
)
def test_a_websocket_is_accepted_only_from_the_servers_own_origin(world, host, origin, accepted):
    assert ws_accepts(world, host, origin) == accepted


@pytest.mark.django_db(transaction=True)
def test_behind_a_tls_proxy_the_origin_is_https(world, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = [(b"x-forwarded-proto", b"https")]
    assert ws_accepts(world, b"localhost", b"https://localhost", proxied)
    assert not ws_accepts(world, b"localhost", b"http://localhost", proxied)
    assert not ws_accepts(world, b"localhost", b"https://localhost")  # no header: plain http


@pytest.mark.django_db(transaction=True)
def test_csrf_trusted_origins_are_accepted_by_scheme_host_and_port(world, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://rft.example.com", "https://*.lab.example"]
    assert ws_accepts(world, b"localhost", b"https://rft.example.com")
    assert ws_accepts(world, b"localhost", b"https://gpu1.lab.example")
    assert not ws_accepts(world, b"localhost", b"https://rft.example.com:8443")
    assert not ws_accepts(world, b"localhost", b"http://rft.example.com")
    assert not ws_accepts(world, b"localhost", b"https://evil.example")


@pytest.mark.django_db(transaction=True)
def test_a_frame_too_big_closes_with_4009(world):
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", session_cookie(world.chosen))]

    async def scenario():
        ws = WebsocketCommunicator(application, f"/ws/annotate/{world.run.pk}/", headers=headers)
        assert (await ws.connect(timeout=10))[0]
        await ws.send_to(text_data="x" * (MAX_CLIENT_MESSAGE_CHARS + 1))
        closed = await ws.receive_output(timeout=10)
        await ws.wait()
        return closed

    assert async_to_sync(scenario)()["code"] == CLOSE_MESSAGE_TOO_BIG == 4009


@pytest.fixture
def daphne_server(tmp_path):
    """daphne serving rftweb.asgi on a free port, on the test database and Redis."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(tmp_path / "daphne.log", "w") as log:
        proc = subprocess.Popen(
            daphne_command(port),
            env=service_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.time() + 90
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "daphne.log").read_text()
                time.sleep(0.5)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_under_daphne_the_origin_check_and_the_close_code_hold(world, daphne_server):
    """Through the real server: its own origin connects, another port or scheme gets a 403 at the
    handshake, and a frame too big is closed with 4009 (daphne refused 1009: the socket ended 1011)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    port, cookie = daphne_server, session_cookie(world.chosen).decode()
    url = f"ws://127.0.0.1:{port}/ws/annotate/{world.run.pk}/"

    async def refused(origin):
        try:
            async with connect(url, origin=origin, additional_headers={"Cookie": cookie}):
                return False
        except InvalidStatus as exc:
            return exc.response.status_code == 403

    async def close_code_of_a_big_frame():
        async with connect(url, origin=f"http://127.0.0.1:{port}", additional_headers={"Cookie": cookie},
                           max_size=None) as ws:
            await ws.send(json.dumps({"type": "ping"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "pong"}
            await ws.send("x" * (MAX_CLIENT_MESSAGE_CHARS + 1))
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None

    async def scenario():
        return (
            await refused("http://127.0.0.1:9999"), await refused(f"https://127.0.0.1:{port}"),
            await close_code_of_a_big_frame(),
        )

    assert asyncio.run(scenario()) == (True, True, 4009)
