"""A researcher picks which tasks a run draws (buffer.task_selector, docs/task-selection.md): in the
launch form's YAML tab they ask for the difficulty selector with a param it does not take
(`target`), and the form names the key and the param it meant, launching nothing; with
`target_reward` the run launches, and its page charts what the selector did each step (the
"explorer · selector" charts: the drawn tasks' distance from the target, how many were never drawn
before, their estimated pass rate once they come round again), while the run keeps what it learned
of each task it drew.

Full stack in Chromium at 1366x768 (daphne, a Celery worker on default and one on train); embedded
through the same views (the run on a thread of this process). With RFTWEB_JOURNEY_SHOTS=DIR the
journey leaves its screenshots there."""
import os
import re
import threading
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.runs.models import MetricPoint, Run
from apps.tasksets.models import TaskDraw
from apps.tasksets.services import load_builtin_tasksets
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]
SHOTS = os.environ.get("RFTWEB_JOURNEY_SHOTS")
STEPS = 12  # 'addition' holds 80 tasks: 10 steps of 8 draw each once, the last 2 choose by pass rate
CONFIG = """\
model: {path: tiny}
algorithm: {name: grpo, repeat_times: 4}
explorer: {batch_size: 8, max_new_tokens: 4, use_chat_template: false}
trainer: {total_steps: %d, lr: 0.001, save_interval: 0}
buffer:
  taskset: addition
  task_selector: {name: difficulty_based, %s: 0.5}
""" % (STEPS, "%s")
MISTAKE = "buffer.task_selector.target: unknown key; did you mean 'target_reward'?"
CHARTS = ("explorer/selector/target_gap", "explorer/selector/unseen", "explorer/selector/estimated_pass_rate")


def shot(page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"task-selection-{name}.png"))


def check_the_run(run: Run) -> None:
    """It completed, logged what its selector did each explorer step and kept what it learned."""
    run.refresh_from_db()
    assert run.status == "completed", run.error
    points = MetricPoint.objects.filter(run=run, role="explorer").order_by("step")
    points = list(points.values_list("values", flat=True))
    assert len(points) == STEPS and all("selector/target_gap" in values for values in points)
    assert [values["selector/unseen"] for values in points] == [8] * 10 + [0, 0]  # 80 tasks, then chosen
    assert "selector/estimated_pass_rate" in points[-1]
    drawn = TaskDraw.objects.filter(run=run)
    assert drawn.count() == 80 and not drawn.filter(seen_step=None).exists()


def test_a_researcher_runs_the_difficulty_selector_and_watches_what_it_draws(researcher, stack, page, login):
    load_builtin_tasksets()
    processes = stack()
    processes.worker("default")
    processes.worker("train")
    page.set_viewport_size({"width": 1366, "height": 768})
    login(researcher, "/runs/new/")
    page.get_by_role("button", name="YAML").click()
    page.get_by_label("Run name").fill("curriculum")
    page.locator("textarea[name=yaml]").fill(CONFIG % "target")
    page.get_by_role("button", name="Launch run").click()
    expect(page.locator(".field.invalid")).to_contain_text(MISTAKE)
    assert not Run.objects.exists()
    shot(page, "refused")

    page.locator("textarea[name=yaml]").fill(CONFIG % "target_reward")
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(name="curriculum")
    wait_for(lambda: Run.objects.get(pk=run.pk).status in Run.FINISHED, timeout=600, what="the run", every=2)
    check_the_run(run)
    page.reload()
    for chart in CHARTS:  # drawn live: each point as the explorer logged it
        page.wait_for_function("([id, n]) => window.rftRunPage?.board.series(id, 'value')?.values.length >= n",
                               arg=[chart, 1 if chart.endswith("estimated_pass_rate") else STEPS])
    section = page.locator("details.chart-section", has_text="explorer · selector")
    expect(section).to_contain_text("5 charts")  # also retired_total, and retired_drawn (none here)
    section.locator("summary").click()
    page.wait_for_function("(id) => window.rftRunPage.board.charts.get(id)?.drawn", arg=CHARTS[0])
    section.scroll_into_view_if_needed()
    shot(page, "run-page")


def test_embedded_the_same_launch_and_run_through_the_same_pages(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    client = Client()
    client.force_login(researcher)
    launch = {"editor": "yaml", "name": "curriculum", "launch": ""}
    refused = client.post(reverse("run-launch"), {**launch, "yaml": CONFIG % "target"})
    assert refused.status_code == 200 and refused.context["form"].errors == {"yaml": [MISTAKE]}
    assert not Run.objects.exists()

    response = client.post(reverse("run-launch"), {**launch, "yaml": CONFIG % "target_reward"})
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    run = Run.objects.get(name="curriculum")
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status in Run.FINISHED, timeout=600, what="the run", every=1)
    finally:
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=120,
                 what="the run's threads to end")
    check_the_run(run)
    page = client.get(response.url)
    assert page.status_code == 200
