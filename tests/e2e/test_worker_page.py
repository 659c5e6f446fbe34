"""A worker's page in Chromium at 1366x768 (static/js/worker.js): a curator follows a real Celery
worker's link from the Workers page, sees what it holds with the run's step, the duties it held and
how each ended, its log's tail, and a duty it ends meanwhile without reloading; drains it (both
pages say "draining") and undrains it; a run page's duty line links the worker. Screenshots go to
$RFTWEB_SCREENSHOTS (default test-artifacts/)."""
import logging
import re
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from apps.runs import holding
from apps.runs.logs import DutyLog
from apps.runs.models import Run, TaskRun, Worker
from apps.runs.supervision import SERVE_TASK, run_dir
from tests.support import wait_for

from .test_dashboard import DEMO_CONFIG, SCREEN, SHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
HOLDER = "gpu-1:77"  # the duty's process, as supervision.worker_id names it


def ran(task_id, node, run, duty, *, ago, result=None):
    ended = {"outcome": "success", "result": result, "runtime_s": ago / 2} if result else {"outcome": "running"}
    TaskRun.objects.create(task_id=task_id, name=SERVE_TASK, args=repr([run.pk, duty]), worker=node,
                           started_at=timezone.now() - timedelta(seconds=ago), **ended)


@pytest.fixture
def beating():
    """Beats for a held duty as its worker's heartbeat thread would (holding.heartbeat), every second."""
    stop, threads = threading.Event(), []

    def start(run, duty):
        def beat():
            try:
                while not stop.wait(1):
                    holding.heartbeat(run, duty, HOLDER)
            finally:
                connection.close()

        threads.append(threading.Thread(target=beat, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=5)


def test_a_curator_follows_a_worker_to_its_page_sees_its_duties_and_drains_it(
        page, login, curator, celery_worker_factory, beating, page_errors):
    worker = celery_worker_factory(queues="train")
    wait_for(lambda: Worker.objects.filter(name=worker.name).exists(), timeout=30, what="the worker's registration")
    now = timezone.now().isoformat()
    held = Run.objects.create(name="held run", owner=curator, config=DEMO_CONFIG, status=Run.Status.RUNNING,
                              trainer_step=3, heartbeats={"loop": {"at": now, "since": now, "started": now,
                                                                   "worker": HOLDER, "node": worker.name,
                                                                   "task": "t-held"}})
    beating(held, "loop")
    done = Run.objects.create(name="done run", owner=curator, config=DEMO_CONFIG, status=Run.Status.COMPLETED)
    ran("t-done", worker.name, done, "loop", ago=600, result="completed")
    ran("t-held", worker.name, held, "loop", ago=0)  # in this life of the worker (registered just now)
    with DutyLog(run_dir(held), held.pk, "loop"):
        logging.getLogger("workers.rft.loop").info("trainer step 3 saved")

    page.set_viewport_size(SCREEN)
    login(curator, "/workers/")
    page.locator(f'tr[data-worker="{worker.name}"] a[data-worker-link]').click()
    expect(page).to_have_url(re.compile(r"/workers/test-\w+@localhost/$"))
    expect(page.locator("[data-worker-name]")).to_have_text(worker.name)
    expect(page.locator("[data-worker-state]")).to_have_text("live")
    hold = page.locator(f'[data-hold="{held.pk}/loop"]')
    expect(hold).to_contain_text("held run")
    expect(hold).to_contain_text("trainer 3 /")
    expect(page.locator("[data-worker-history] [data-how]")).to_have_text(["holding", "completed"])
    expect(page.locator("[data-worker-logs] .log-line")).to_contain_text(["trainer step 3 saved"])
    # A duty it held ends elsewhere: the page shows it at its next poll (every 5 s), unreloaded.
    ran("t-back", worker.name, done, "explorer", ago=0, result="handed back")
    expect(page.locator("[data-worker-history] [data-how]")).to_have_text(["handed back", "holding", "completed"],
                                                                          timeout=15_000)
    page.screenshot(path=SHOTS / "worker-page.png", full_page=True)

    page.locator('[data-drain="drain"] button').click()
    page.locator(".confirm-pop").get_by_role("button", name="Drain").click()
    expect(page.locator("[data-worker-state]")).to_have_text("draining")
    expect(page.locator("[data-worker-draining]")).to_contain_text(f"Drained by {curator.username}")
    assert Worker.objects.get(name=worker.name).drain["by"] == curator.username
    page.goto("/workers/")
    expect(page.locator(f'tr[data-worker="{worker.name}"] [data-draining]')).to_have_text("draining")
    page.goto(f"/workers/{worker.name}/")
    page.locator('[data-drain="undrain"] button').click()
    expect(page.locator("[data-worker-state]")).to_have_text("live")
    expect(page.locator('[data-drain="drain"]')).to_be_visible()
    assert Worker.objects.get(name=worker.name).drain == {}

    # The run page's duty line links the worker holding it.
    page.goto(f"/runs/{held.pk}/")
    link = page.locator('#run-duties [data-duty="loop"] a.duty-worker')
    expect(link).to_have_text(worker.name)
    link.click()
    expect(page.locator("[data-worker-name]")).to_have_text(worker.name)
    assert page_errors == []
