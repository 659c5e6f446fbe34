"""Issue #20, finding 7: every page is served with a Content-Security-Policy that allows scripts
from this site only (rftweb/csp.py), and the pages' own scripts live with it: the run page (live
charts drawn by Plotly), the annotation page, the launch page and the admin load in Chromium with
no CSP violation. A control shows the policy is really enforced on the page: an injected inline
event handler is refused, and reported."""
import re

import pytest
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

from .test_dashboard import DEMO_CONFIG, seed_history

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Recorded in every page before its own scripts run: what the browser refused, and why.
LISTEN = """window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.cspViolations.push(
  `${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));"""


def violations(page, console) -> list[str]:
    refused = [line for line in console if "Refused to" in line or "Content Security Policy" in line]
    return page.evaluate("window.cspViolations") + refused


def test_the_run_annotation_launch_and_admin_pages_load_with_no_csp_violation(page, login, curator, page_errors):
    # Running: the page watches it over the websocket, which the policy must let through too.
    run = Run.objects.create(name="csp", owner=curator, status=Run.Status.RUNNING, config=DEMO_CONFIG,
                             explorer_step=20, trainer_step=20, model_version=20)
    seed_history(run, steps=20)
    task = Task.objects.create(taskset=Taskset.objects.create(name="csp-tasks"), index=0, prompt="1+1?", answer="2")
    experience = Experience.objects.create(
        run=run, task=task, explorer_step=1, rollout_index=0, group_id="g", prompt_text="1+1?", response_text="2",
        prompt_ids=[1], response_ids=[2], action_mask=[1], reward=1.0, model_version=1,
    )
    console = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.add_init_script(LISTEN)
    login(curator, f"/runs/{run.pk}/")

    # The run page: its scripts ran (the live snapshot filled the figures, Plotly drew a chart,
    # the websocket is open).
    policy = page.request.get(f"/runs/{run.pk}/").headers["content-security-policy"]
    assert "script-src 'self'" in policy
    page.wait_for_function("() => [...(window.rftRunPage?.board.charts.values() || [])].some((c) => c.drawn)")
    expect(page.locator("#live-dot")).to_have_text("live")
    assert violations(page, console) == [], violations(page, console)

    # The control: an injected inline handler does not run, and the listener hears the refusal.
    page.evaluate("""() => { window.injected = false;
      document.body.insertAdjacentHTML("beforeend", '<img src="data:," onload="window.injected = true">'); }""")
    page.wait_for_function("() => window.cspViolations.length > 0")
    assert page.evaluate("window.injected") is False
    assert "script-src" in violations(page, console)[0], violations(page, console)
    console.clear()

    checks = {
        f"/annotate/experience/{experience.pk}/": lambda: expect(page.locator("body")).to_contain_text("1+1?"),
        "/runs/new/": lambda: expect(page.locator('[name="model.path"]')).to_be_visible(),
        "/admin/": lambda: expect(page.locator("#site-name")).to_be_visible(),
        "/admin/buffer/experience/": lambda: expect(page.locator("#result_list")).to_be_visible(),
        f"/admin/buffer/experience/{experience.pk}/change/": lambda: expect(page.locator("form")).not_to_have_count(0),
        "/accounts/password_change/": lambda: expect(page.get_by_label("Old password")).to_be_visible(),
        # its script drew the tables from the JSON in the page (no worker here: the empty row)
        "/workers/": lambda: expect(page.locator('[data-workers="workers"]')).to_contain_text("No live worker"),
    }
    for path, loaded in checks.items():
        page.goto(path)
        # (the item page writes its queue into its address: annotate.js)
        expect(page).to_have_url(re.compile(re.escape(path) + r"(\?.*)?$"))
        loaded()
        page.wait_for_load_state("networkidle")
        assert violations(page, console) == [], (path, violations(page, console))
    assert page_errors == []
