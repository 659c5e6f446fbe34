"""Load on loopback against the real ASGI server (daphne, a subprocess) and the Redis channel layer:
100 websocket clients on one run's live page, and the dashboard endpoints under concurrent users.
Bounds are generous (CI is a loaded 2-core machine); the figures are printed (run with -s) and
written to <data dir>/load-figures.json."""
import asyncio
import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from websockets.asyncio.client import connect

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.runs import services
from apps.runs.models import Run
from tests.support import daphne_command, service_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WS_CLIENTS = 100
UPDATES = 40
DASHBOARD_USERS, REQUESTS_EACH = 20, 10


def p95(values):
    ordered = sorted(values)
    return ordered[max(0, int(round(0.95 * len(ordered))) - 1)]


@pytest.fixture
def server_log(tmp_path):
    return tmp_path / "daphne.log"


@pytest.fixture
def server(tmp_path):
    """daphne serving rftweb.asgi on a free port, on the test database and Redis."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = service_env(DB_CONN_MAX_AGE="60")  # the production default, not the tests' 0
    log = open(tmp_path / "daphne.log", "w")
    proc = subprocess.Popen(daphne_command(port), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            httpx.get(f"{base}/accounts/login/", timeout=2)
            break
        except httpx.TransportError:
            assert proc.poll() is None, (tmp_path / "daphne.log").read_text()
            time.sleep(0.5)
    else:
        raise AssertionError("daphne did not start")
    yield base
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.fixture
def session(researcher):
    client = Client()
    client.force_login(researcher)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def record_figures(**figures):
    path = settings.DATA_DIR / "load-figures.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**saved, **figures}, indent=2))
    print(json.dumps(figures, indent=2))


def test_100_websocket_clients_on_one_run_get_every_update(server, server_log, session, researcher):
    run = Run.objects.create(name="watched", owner=researcher, config={})
    ws_url = server.replace("http", "ws") + f"/ws/runs/{run.pk}/"

    async def client(ready: asyncio.Event, all_connected: asyncio.Event, connected: list, received: list):
        async with connect(ws_url, origin=server, additional_headers={"Cookie": session}, open_timeout=60) as ws:
            connected.append(time.perf_counter() - started)
            if len(connected) == WS_CLIENTS:
                all_connected.set()
            seen, steps = [], []
            latencies = []
            while len(steps) < UPDATES:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=120))
                now = time.time()
                seen.append(message["seq"])
                for update in message["updates"]:
                    if update["type"] == "metrics":
                        steps.append(update["step"])
                        latencies.append(now - update["values"]["sent_at"])
            received.append((seen, steps, latencies))

    def record(step):
        try:
            services.record_metrics(run, "trainer", step, {"loss": 1 / step, "sent_at": time.time()})
        finally:
            connection.close()  # this executor thread's own

    async def scenario():
        nonlocal connect_s
        connected, received = [], []
        all_connected = asyncio.Event()
        clients = [asyncio.create_task(client(None, all_connected, connected, received)) for _ in range(WS_CLIENTS)]
        # Until every client is connected, or one has failed (then say why, not just "timed out").
        waiting = asyncio.create_task(all_connected.wait())
        done, _ = await asyncio.wait([waiting, *clients], timeout=180, return_when=asyncio.FIRST_COMPLETED)
        if waiting not in done:
            failed = [task.exception() for task in clients if task.done()]
            for task in [waiting, *clients]:
                task.cancel()
            raise AssertionError(f"{len(connected)} of {WS_CLIENTS} clients connected; first failures: {failed[:3]}; "
                                 f"daphne log: {server_log.read_text()[-3000:]}")
        connect_s = max(connected)
        await asyncio.sleep(1)  # every consumer has joined the group
        for step in range(1, UPDATES + 1):
            await asyncio.to_thread(record, step)
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*clients, return_exceptions=True)
        return received, [r for r in results if isinstance(r, BaseException)]

    connect_s, started = None, time.perf_counter()
    received, errors = asyncio.run(scenario())
    latencies = [latency for _, _, client_latencies in received for latency in client_latencies]
    record_figures(websocket={
        "clients": WS_CLIENTS, "all_connected_s": round(connect_s, 2), "updates_each": UPDATES, "errors": len(errors),
        "updates_received": len(latencies), "p95_update_latency_s": round(p95(latencies), 3),
        "max_update_latency_s": round(max(latencies), 3),
    })
    assert not errors, errors[:3]
    assert len(received) == WS_CLIENTS
    for seen, steps, _ in received:
        assert seen == list(range(1, len(seen) + 1)), "a message was lost or reordered"
        assert steps == list(range(1, UPDATES + 1)), "an update was lost"
    assert p95(latencies) < 10


def test_the_dashboard_under_concurrent_users(server, researcher):
    run = Run.objects.create(name="busy", owner=researcher, config={"trainer": {"total_steps": 100}})
    for step in range(1, 101):
        services.record_metrics(run, "trainer", step, {"loss": 1 / step, "reward": step / 100})
    users = [create_user(f"load{i}", "pw-for-tests-123", roles=(RESEARCHER,)) for i in range(DASHBOARD_USERS)]
    cookies = []
    for user in users:
        client = Client()
        client.force_login(user)
        cookies.append({settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value})
    pages = [
        "/", "/runs/", f"/runs/{run.pk}/", f"/runs/{run.pk}/live.json", "/api/runs/", f"/api/runs/{run.pk}/metrics/"
    ]

    async def user_session(cookie):
        timings, failures = [], []
        async with httpx.AsyncClient(base_url=server, cookies=cookie, timeout=60) as http:
            for i in range(REQUESTS_EACH):
                page = pages[i % len(pages)]
                started = time.perf_counter()
                try:
                    response = await http.get(page)
                    if response.status_code != 200:
                        failures.append(f"{page}: {response.status_code}")
                except httpx.HTTPError as err:
                    failures.append(f"{page}: {err!r}")
                timings.append(time.perf_counter() - started)
        return timings, failures

    async def scenario():
        return await asyncio.gather(*(user_session(cookie) for cookie in cookies))

    results = asyncio.run(scenario())
    timings = [t for user_timings, _ in results for t in user_timings]
    failures = [f for _, user_failures in results for f in user_failures]
    record_figures(dashboard={
        "users": DASHBOARD_USERS, "requests": len(timings), "errors": len(failures),
        "p95_latency_s": round(p95(timings), 3), "max_latency_s": round(max(timings), 3),
    })
    assert not failures, failures[:5]
    assert p95(timings) < 20
