"""Issue #30 through the real server (daphne, the Redis cache and channel layer): medium finding 8,
logins throttled on the real login page; low finding 14, a websocket message over daphne's limit
closed with 4009 rather than dropped without a close code."""
import asyncio
import html
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
from django.conf import settings
from django.test import Client

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.runs.models import Run
from tests.support import daphne_command, forget_login_failures, service_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-123"
LOCKOUT_SECONDS = 3
DAPHNE_MAX_MESSAGE_BYTES = 1024 * 1024  # daphne's default --websocket-max-message-size


@pytest.fixture
def server(tmp_path):
    """daphne serving rftweb.asgi on a free port, with small login limits; yields its base URL."""
    forget_login_failures()  # counts an earlier test left would count against these small limits
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = service_env(
        RFTWEB_LOGIN_FAILURES_PER_ACCOUNT="3",
        RFTWEB_LOGIN_FAILURES_PER_ADDRESS="5",
        RFTWEB_LOGIN_LOCKOUT_SECONDS=str(LOCKOUT_SECONDS),
    )
    log = tmp_path / "daphne.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            daphne_command(port),
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                httpx.get(f"{base}/accounts/login/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, log.read_text()
                time.sleep(0.5)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def log_in(base: str, username: str, password: str) -> tuple[bool, str]:
    """Fill in the login page as a browser does: whether it logged in, and the page's error."""
    with httpx.Client(base_url=base, timeout=10) as browser:
        page = browser.get("/accounts/login/").text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        response = browser.post(
            "/accounts/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token}
        )
        error = re.search(r'<p class="error"[^>]*>(.*?)</p>', response.text)
        return response.status_code == 302, html.unescape(error.group(1)) if error else ""


def test_the_login_page_locks_an_account_and_an_address_then_lets_them_in_after_the_window(server):
    for name in ("alice", "bob"):
        create_user(name, PASSWORD, roles=[RESEARCHER])
    assert [log_in(server, "alice", "guess") for _ in range(3)] == [
        (False, "Your username and password didn't match. Please try again.")
    ] * 3
    logged_in, error = log_in(server, "alice", PASSWORD)
    assert not logged_in and error.startswith("Too many failed logins from this address or for this account")
    # Two more failures from this address, for accounts that do not exist: five in all lock it.
    assert log_in(server, "nobody", "guess")[0] is False and log_in(server, "nobody-else", "guess")[0] is False
    assert log_in(server, "bob", PASSWORD) == (False, error)
    time.sleep(LOCKOUT_SECONDS + 0.5)
    assert log_in(server, "alice", PASSWORD) == (True, "")
    assert log_in(server, "bob", PASSWORD) == (True, "")


def test_a_websocket_message_over_the_servers_limit_is_closed_with_4009(server, researcher):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    run = Run.objects.create(name="r", owner=researcher, config={})
    client = Client()
    client.force_login(researcher)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    url = server.replace("http://", "ws://") + f"/ws/runs/{run.pk}/"

    async def close_code():
        async with connect(url, origin=server, additional_headers={"Cookie": cookie}, max_size=None) as ws:
            await ws.send("x" * (DAPHNE_MAX_MESSAGE_BYTES + 1))
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None  # None: dropped without a close frame

    assert asyncio.run(close_code()) == 4009
