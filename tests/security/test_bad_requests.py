"""Bad API requests and websocket messages: a clear error, the connection or database unharmed."""
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Run
from rftweb.asgi import application


@pytest.fixture
def api(researcher):
    client = Client(enforce_csrf_checks=True)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token_for(researcher)}"}

    def call(method, url, data=None, content_type="application/json", **extra):
        if method == "get":
            return client.get(url, data, **headers, **extra)
        return client.generic(method.upper(), url, data or b"", content_type=content_type, **headers, **extra)

    return call


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


def runs_url(_run):
    return reverse("api-runs")


# (method, url maker, body or query, expected status, words the error must contain)
API_CASES = {
    "body-not-json": ("post", runs_url, b"{name: oops", 400, "must be JSON"),
    "body-not-utf8": ("post", runs_url, b"\xff\xfe\x00", 400, "must be JSON"),
    "body-json-array": ("post", runs_url, b"[1, 2]", 400, "JSON object"),
    "body-deeply-nested": ("post", runs_url, b"[" * 100_000 + b"]" * 100_000, 400, "must be JSON"),
    "body-too-big": (
        "post", runs_url, json.dumps({"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}).encode(), 400,
        "larger than",
    ),
    "config-a-list": ("post", runs_url, json.dumps({"config": [1, 2]}).encode(), 400, "invalid config"),
    "config-a-number": ("post", runs_url, json.dumps({"config": 5}).encode(), 400, "invalid config"),
    "name-not-a-string": (
        "post", runs_url, json.dumps({"name": {"a": 1}, "config": {}}).encode(), 400, "name must be a string"
    ),
    "name-with-nul": ("post", runs_url, json.dumps({"name": "a\x00b", "config": {}}).encode(), 400, "NUL"),
    "name-too-long": (  # it was cut to 200 characters without a word
        "post", runs_url, json.dumps({"name": "n" * 201, "config": {}}).encode(), 400,
        "name is 201 characters long; at most 200",
    ),
    # false, 0 and [] read as left out: a run of "api run" with every default (a review found it)
    **{f"name-{label}": ("post", runs_url, json.dumps({"name": value, "config": {}}).encode(), 400, problem)
       for label, value, problem in [("false", False, "name must be a string"), ("zero", 0, "name must be a string"),
                                     ("list", [], "name must be a string"), ("spaces", "   ", "name is empty")]},
    **{f"config-{label}": ("post", runs_url, json.dumps({"config": value}).encode(), 400, problem)
       for label, value, problem in [("false", False, "expected a mapping"), ("zero", 0, "expected a mapping"),
                                     ("empty-list", [], "expected a mapping"),
                                     ("empty-text", " ", "YAML text is empty")]},
    "sweep-range-past-a-float": (  # math.isfinite raised OverflowError: a 500
        "post", lambda run: reverse("api-sweeps"),
        json.dumps({"name": "s", "config": {"buffer": {"taskset": "arithmetic"}}, "method": "random", "count": 2,
                    "space": [{"key": "seed", "low": 0, "high": 10**400}]}).encode(), 400, "a range needs two numbers",
    ),
    "config-string-with-nul": (
        "post", runs_url,
        json.dumps({"config": {"explorer": {"system_prompt": "hi\x00"}, "buffer": {"taskset": "t"}}}).encode(),
        400, "invalid config",
    ),
    "put-method": ("put", runs_url, b"{}", 405, "use GET or POST"),
    "delete-run": ("delete", lambda run: reverse("api-run", args=[run.pk]), b"", 405, "use GET"),
    "unknown-run": ("get", lambda run: reverse("api-run", args=[run.pk + 1000]), None, 404, "No Run matches"),
    "bad-status-filter": ("get", runs_url, {"status": "bogus"}, 400, "invalid filters"),
    "nul-in-search": ("get", runs_url, {"q": "a\x00"}, 400, "query parameter 'q' holds a NUL"),
    "since-not-a-number": ("get", lambda run: reverse("api-run-metrics", args=[run.pk]), {"since": "-1"}, 400, "since"),
    "bad-min-reward": (
        "get", lambda run: reverse("api-run-experiences", args=[run.pk]), {"min_reward": "lots"}, 400, "invalid filters"
    ),
    "control-a-finished-run": ("post", lambda run: reverse("api-run-resume", args=[run.pk]), b"", 409, "cannot resume"),
}


@pytest.mark.parametrize("method, url, data, status, words", API_CASES.values(), ids=API_CASES.keys())
def test_bad_api_request_gets_a_json_error_and_changes_nothing(api, run, method, url, data, status, words):
    before = list(Run.objects.values_list("pk", "status", "name"))
    response = api(method, url(run), data)
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/json"
    assert words in json.dumps(response.json()), response.json()
    assert list(Run.objects.values_list("pk", "status", "name")) == before


def test_a_bad_token_is_a_401_not_a_login_page(db):
    response = Client().get(reverse("api-runs"), HTTP_AUTHORIZATION="Bearer rft_1_forged")
    assert response.status_code == 401 and response.json()["error"] == "invalid API token"
    assert response["WWW-Authenticate"].startswith("Bearer")


# ---- websocket messages --------------------------------------------------------------------------

WS_CASES = {
    "malformed-json": ("text", "{type: ping"),
    "json-array": ("text", "[1, 2]"),
    "json-string": ("text", '"ping"'),
    "unknown-type": ("text", '{"type": "subscribe", "run": 1}'),
    "whitespace": ("text", "   "),
    "binary-frame": ("bytes", b"\x00\x01\x02"),
    "deeply-nested-json": ("text", "[" * 2000 + "]" * 2000),
}
SOCKETS = ("/ws/runs/{}/", "/ws/annotate/{}/")


def ws_connect(path, cookie):
    return WebsocketCommunicator(
        application, path, headers=[(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    )


def session_cookie(client, user) -> bytes:
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def send_bad_then_ping(path, cookie, kind, frame):
    async def scenario():
        ws = ws_connect(path, cookie)
        assert (await ws.connect())[0]
        await (ws.send_to(bytes_data=frame) if kind == "bytes" else ws.send_to(text_data=frame))
        reply = await ws.receive_json_from(timeout=10)
        await ws.send_json_to({"type": "ping"})  # the socket still works
        pong = await ws.receive_json_from(timeout=10)
        await ws.disconnect()
        return reply, pong

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("socket", SOCKETS)
@pytest.mark.parametrize("kind, frame", WS_CASES.values(), ids=WS_CASES.keys())
def test_a_bad_message_gets_an_error_and_the_socket_stays_open(client, researcher, socket, kind, frame):
    run = Run.objects.create(name="r", owner=researcher, config={})
    reply, pong = send_bad_then_ping(socket.format(run.pk), session_cookie(client, researcher), kind, frame)
    assert reply["type"] == "error" and reply["error"]
    assert pong["type"] == "pong"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("socket", SOCKETS)
def test_a_huge_frame_closes_the_socket_before_it_is_parsed(client, researcher, socket):
    run = Run.objects.create(name="r", owner=researcher, config={})
    cookie = session_cookie(client, researcher)

    async def scenario():
        ws = ws_connect(socket.format(run.pk), cookie)
        assert (await ws.connect())[0]
        await ws.send_to(text_data=json.dumps({"type": "ping", "pad": "x" * 5_000_000}))
        closed = await ws.receive_output(timeout=10)
        await ws.wait()
        return closed

    closed = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": 4009, "reason": "message too big"}
