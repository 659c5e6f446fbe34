"""The Workers page for a curator (issue #44, item 6): the broker's queue lengths, and a duty a
worker holds handed back to its queue or its run stopped, from the page, with the guarantees of
Stop: the duty saves at its next step and lets go; handed back, it is queued again at once keeping
its place and a free slot takes it (here the same worker's: its only one), the run carrying on from
the step it let go at with every trainer step once; stopped, the run stops. Full stack in Chromium
(a Celery worker of one slot), and embedded through the same view (the server's threads serve the
duty). Researchers see no such buttons and are refused."""
import threading

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from apps.runs import logs, services
from apps.runs.models import MetricPoint, Run
from apps.runs.supervision import run_dir
from tests.support import make_taskset, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def config() -> dict:
    return {
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 4},
        "explorer": {"batch_size": 4, "max_new_tokens": 8},
        "trainer": {"lr": 1e-3, "micro_batch_size": 16, "total_steps": 400, "save_interval_s": 0},
        "buffer": {"taskset": "arith"},
    }


def row(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def handed_back_and_carried_on(run: Run) -> int:
    """The duty said why it let go (its log), saved at that step, and the run trained on from the
    next step, every step once, with nobody resuming it. Returns the step it let go at."""
    said = lambda: [line for line in logs.read(run_dir(run))["lines"]  # noqa: E731
                    if "cur handed it back to its queue" in line["message"]]
    wait_for(said, timeout=120, what="the duty handing the run back")
    let_go = max(c.step for c in row(run).checkpoints.all())
    wait_for(lambda: row(run).trainer_step >= let_go + 2, timeout=180, what="training again")
    steps = list(MetricPoint.objects.filter(run=run, role="trainer").values_list("step", flat=True))
    assert sorted(steps) == list(range(1, max(steps) + 1)), "a trainer step was lost or recorded twice"
    assert row(run).status == "running" and row(run).resumes == []
    return let_go


def test_a_curator_hands_a_duty_back_and_stops_its_run_from_the_workers_page(curator, researcher, stack, page, login):
    make_taskset()
    processes = stack()
    processes.worker("default")
    processes.worker("train,explore", name="one@localhost")  # one slot
    processes.beat()
    run = services.launch_run(curator, "handed back", config())
    wait_for(lambda: row(run).trainer_step >= 2, what="training", every=0.2)

    login(researcher, "/workers/")
    expect(page.locator("[data-worker='one@localhost']")).to_contain_text("handed back")
    expect(page.locator("[data-duty-action]")).to_have_count(0)  # researchers watch; curators act
    page.context.clear_cookies()
    login(curator, "/workers/")
    expect(page.locator("[data-workers-summary]")).to_contain_text("in the broker: default 0, explore 0, train 0")
    hold = page.locator("[data-worker='one@localhost'] li", has_text="handed back")
    hold.get_by_role("button", name="Hand back").click()
    page.locator(".confirm-pop").get_by_role("button", name="Hand back").click()
    expect(page.locator(".flash.success")).to_contain_text("Handing back loop of handed back")
    let_go = handed_back_and_carried_on(run)
    # The run page's Logs panel: why the duty let go, then where its new holding went on from.
    page.goto(f"/runs/{run.pk}/")
    panel = page.locator("#run-logs")
    expect(panel).to_contain_text("cur handed it back to its queue")
    expect(panel).to_contain_text(f"(loop): resumed from checkpoint v{let_go} (trainer step {let_go})")
    page.goto("/workers/")  # the task that served the duty ended: its row says how
    expect(page.locator("[data-workers-tasks] tr", has_text="serve_duty").filter(has_text="handed back")
           ).to_contain_text("success")

    page.goto("/workers/")
    hold = page.locator("[data-worker='one@localhost'] li", has_text="handed back")
    hold.get_by_role("button", name="Stop run").click()
    page.locator(".confirm-pop").get_by_role("button", name="Stop run").click()
    expect(page.locator(".flash.success")).to_contain_text("Stopping handed back")
    wait_for(lambda: row(run).status == "stopped", timeout=120, what="the run stopped")


def test_embedded_a_curator_hands_the_duty_back_to_the_servers_threads(curator, researcher, client, settings):
    settings.RFTWEB_EMBEDDED = True  # rftweb.celery.enqueue: each duty a thread of this process
    make_taskset()
    run = services.launch_run(curator, "handed back", config())
    try:
        wait_for(lambda: row(run).trainer_step >= 2, what="training", every=0.2)
        url = reverse("worker-duty", args=[run.pk, "loop", "hand-back"])
        client.force_login(researcher)
        assert client.post(url).status_code == 403
        assert client.get(reverse("api-workers")).json()["queued"] is None  # no broker
        client.force_login(curator)
        assert client.post(url).status_code == 302
        handed_back_and_carried_on(run)
        tasks = client.get(reverse("api-workers")).json()["tasks"]  # the server's threads log their tasks too
        assert any(t["name"] == "serve_duty" and t["result"] == "handed back" for t in tasks), tasks
        assert client.post(reverse("worker-duty", args=[run.pk, "loop", "stop"])).status_code == 302
        wait_for(lambda: row(run).status == "stopped", timeout=120, what="the run stopped")
    finally:
        if not row(run).is_finished:
            services.stop_run(row(run))
        wait_for(lambda: not [t for t in threading.enumerate() if f"({run.pk}, " in t.name or f"({run.pk},)" in t.name],
                 timeout=120, what="the run's duty threads to end")
