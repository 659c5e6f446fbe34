"""Browser tests: headless Chromium (Playwright) against the real ASGI server (daphne) on the test
database and Redis, with real Celery workers (`celery_worker_factory`) where a run must train.

Chromium is Debian's (`apt-get install chromium`); set RFTWEB_CHROMIUM to use another binary.
On failure a test leaves a screenshot, a Playwright trace (`playwright show-trace <file>`), the
page's console and the server's and workers' logs in test-artifacts/<test name>/.

`page.wait_for_function` takes a function ("() => ...", "(arg) => ..."), never a bare expression:
Playwright evals a bare expression again on every poll inside the page, which the app's CSP
(script-src 'self') refuses, so such a wait fails whenever its first check is false (CI, af7acd7).
"""

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import daphne_command, database_url, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("RFTWEB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "pw-for-tests-123"  # the password tests/conftest.py gives its users


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures know at teardown whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request) -> bool:
    reports = (getattr(request.node, f"report_{when}", None) for when in ("setup", "call"))
    return any(report is not None and report.failed for report in reports)


def _artifact_dir(request) -> Path:
    path = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.nodeid.split("::", 1)[-1])[:120]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def asgi_server_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("daphne") / "daphne.log"


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, asgi_server_log):
    """The real ASGI app (HTTP and websockets) under daphne, on the test database and Redis, as a
    subprocess on a free port. Yields its base URL. Tests using it must be transactional: the
    server sees only committed rows."""
    from django.conf import settings

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "rftweb.test_settings",
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "RFTWEB_DATA_DIR": str(settings.DATA_DIR),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the server must keep Django's async safety checks
    port = free_port()
    with open(asgi_server_log, "w") as log:
        proc = subprocess.Popen(
            daphne_command(port),
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_for_port(port, proc, asgi_server_log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.fixture
def browser(transactional_db, monkeypatch):
    """Headless Chromium, one per test.

    Playwright's sync API keeps an asyncio loop running on this thread while it is started, which
    Django takes for an async context: the ORM in the test (and pytest-django's flush) would refuse
    to run. Nothing async runs on this thread meanwhile, so the check is lifted while the browser
    lives; the fixture depends on transactional_db so that the flush runs after it has stopped."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the e2e tests need the playwright package (requirements.txt): make install")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium, or set RFTWEB_CHROMIUM")
    from django.db import connections

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()
    finally:
        # With a loop running, Django keeps connections per context instead of per thread: close
        # the ones the test opened now, as nothing else would (and the test database could not
        # be dropped at the end).
        connections.close_all()
        playwright.stop()


@pytest.fixture
def page_errors():
    """Uncaught exceptions of the test's pages (a test asserts there are none)."""
    return []


@pytest.fixture
def page(request, browser, asgi_server, asgi_server_log, page_errors, tmp_path):
    """A fresh browser context and page on the server (relative URLs work: page.goto("/runs/")).
    On failure: screenshot, trace, console and logs in test-artifacts/<test>/."""
    context = browser.new_context(base_url=asgi_server, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(15_000)
    # Assertions wait as long as actions: under CI's load (two xdist workers training beside the
    # browser on 2 cores) the compare page of a 6-run sweep answered Show after Playwright's
    # default 5 s, and test_sweeps failed on a page that was still loading.
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    tracing = os.environ.get("RFTWEB_E2E_TRACE", "1") != "0"
    if tracing:
        # DOM snapshots, no screencast: the frames of a tall live page (1280x4000, charts redrawn
        # each step) made a trace whose writing hung a failed test's teardown past pytest-timeout.
        context.tracing.start(screenshots=False, snapshots=True)
    page = context.new_page()
    console = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    server_log_start = asgi_server_log.stat().st_size if asgi_server_log.exists() else 0
    yield page
    if _failed(request):
        # Playwright is installed: the browser fixture checked it.
        from playwright.sync_api import Error as PlaywrightError

        out = _artifact_dir(request)
        # The logs first (files only: nothing here can hang), then what the browser must make.
        (out / "console.txt").write_text(
            "\n".join([f"url: {page.url}", *console, *(f"pageerror: {error}" for error in page_errors)]) + "\n"
        )
        with open(asgi_server_log, "rb") as log:
            log.seek(server_log_start)
            (out / "daphne.log").write_bytes(log.read())
        for worker_log in tmp_path.glob("*.log"):  # celery_worker_factory's logs
            shutil.copy(worker_log, out / worker_log.name)
        try:
            page.screenshot(path=out / "page.png", timeout=10_000, animations="disabled")
        except PlaywrightError as err:  # a crashed or stuck page has no screenshot; keep the rest
            (out / "screenshot-error.txt").write_text(str(err))
        if tracing:
            context.tracing.stop(path=out / "trace.zip")
    elif tracing:
        context.tracing.stop()
    context.close()


@pytest.fixture
def login(page):
    """login(user): sign in through the login form (every page redirects there first)."""

    def login(user, next_path="/"):
        page.goto(next_path)
        page.wait_for_url(re.compile(r"/accounts/login/"))
        page.get_by_label("Username").fill(user.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(lambda url: "/accounts/login/" not in url)

    return login
