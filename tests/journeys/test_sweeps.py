"""A researcher sweeps trainer.lr x algorithm.kl.coef over 6 runs (issue #44, "done when"): asks for
an email on the Alerts page, fills the launch form's Sweep box, lands on the sweep's page, and
watches its table fill with each run's best held-out figure and its chart draw a line per run,
compares the runs' samples for one task and saves that as a report; when the last run ends, one
email says the sweep ended, linking its page. Full stack in Chromium
(Celery workers, two train slots, mail through Django's file backend on the worker), and embedded
through the same views (the runs on threads of this process, mail in Django's outbox)."""
import json
import re
import threading

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.alerts.models import Alert
from apps.runs.models import Run, Sweep
from apps.tasksets.services import load_builtin_tasksets
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SPACE = "trainer.lr: 0.001, 0.003, 0.01\nalgorithm.kl.coef: 0, 0.01"
# The quick demo's MIX run, 4 steps, evaluated at 0, 2 and 4: a sweep a machine runs in a minute.
SHORT = {"trainer.total_steps": "4", "explorer.eval_interval": "2", "algorithm.kl.fn": "k3"}


def sweep_ended(sweep: Sweep) -> bool:
    sweep.refresh_from_db()
    return sweep.ended_at is not None


def check_the_sweep(sweep: Sweep) -> list[Run]:
    runs = list(sweep.runs.order_by("pk"))
    assert len(runs) == 6 and {run.status for run in runs} == {"completed"}, [(r.name, r.error) for r in runs]
    assert [(run.swept["trainer.lr"], run.swept["algorithm.kl.coef"]) for run in runs] == [
        (lr, coef) for lr in (0.001, 0.003, 0.01) for coef in (0, 0.01)]
    assert all(run.config["trainer"]["lr"] == run.swept["trainer.lr"] for run in runs)
    return runs


def test_a_researcher_sweeps_lr_and_kl_from_the_browser_and_is_emailed_when_it_ends(
        researcher, stack, page, login, tmp_path):
    load_builtin_tasksets()
    outbox = tmp_path / "mail"
    processes = stack(EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend", EMAIL_FILE_PATH=str(outbox))
    processes.worker("default")
    processes.worker("train", slots=2)

    login(researcher, "/alerts/")
    page.get_by_label("By email").check()
    page.get_by_label("Email address").fill("res@example.org")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".flash")).to_contain_text("Alert settings saved")

    page.goto("/runs/new/")
    page.get_by_label("Run name").fill("lr x kl")
    for key, value in SHORT.items():
        field = page.locator(f"[name='{key}']")
        field.select_option(value) if field.evaluate("e => e.tagName") == "SELECT" else field.fill(value)
    page.get_by_label("Sweep over").fill(SPACE)
    page.get_by_role("button", name="Launch sweep").click()
    page.wait_for_url(re.compile(r"/sweeps/\d+/$"))
    expect(page.locator(".flash")).to_contain_text("Launched sweep lr x kl: 6 runs")
    sweep = Sweep.objects.get()
    expect(page.locator("#sweep-runs tbody tr")).to_have_count(6)

    wait_for(lambda: sweep_ended(sweep), timeout=600, what="the sweep's 6 runs", every=2)
    runs = check_the_sweep(sweep)
    page.reload()
    rows = page.locator("#sweep-runs tbody tr")
    expect(rows.first).to_contain_text("completed")
    held_out = [rows.nth(i).locator("td").nth(5).inner_text() for i in range(6)]
    assert all(re.fullmatch(r"\d\.\d+|\d", text) for text in held_out), held_out  # each run's best, best first
    assert [float(text) for text in held_out] == sorted((float(text) for text in held_out), reverse=True)
    expect(page.locator("#sweep-chart .scatterlayer .trace")).to_have_count(6)  # a line per run
    page.screenshot(path=str(tmp_path / "sweep.png"))
    page.get_by_role("link", name="Compare these runs").click()
    expect(page.locator("#compare-config")).to_contain_text("trainer.lr")
    # What each run wrote for one task at the last step, side by side; then saved as a report.
    page.locator("[data-chart-filter]").fill("reward")
    page.locator("#compare-samples select[name=task]").select_option(index=1)
    page.locator("#compare-samples").get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"[?&]task=\d+"))
    expect(page.locator(".sample-column")).to_have_count(6)
    page.locator("#save-report").get_by_label("Name").fill("lr x kl: what it showed")
    page.locator("#save-report").get_by_label("Note").fill("the highest lr wins on held-out")
    page.get_by_role("button", name="Save report").click()
    page.wait_for_url(re.compile(r"/reports/\d+/$"))
    expect(page.locator("h1")).to_have_text("lr x kl: what it showed")
    expect(page.locator(".report-note")).to_contain_text("the highest lr wins")
    expect(page.locator(".sample-column")).to_have_count(6)
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)

    (message,) = wait_for(lambda: list(outbox.glob("*.log")), timeout=120, what="the email")
    text = message.read_text()
    assert "To: res@example.org" in text and "sweep 'lr x kl' ended: 6 completed" in text
    assert f"/sweeps/{sweep.pk}/" in text
    assert [a.event for a in Alert.objects.all()] == ["sweep.ended"]  # not one a run
    assert all(run.finished_at <= sweep.ended_at for run in runs)


def test_embedded_the_same_sweep_through_the_same_pages(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    client = Client()
    client.force_login(researcher)
    saved = client.post(reverse("alert-settings"), {"on_finish": "on", "on_failure": "on", "email": "on",
                                                   "address": "res@example.org"})
    assert saved.status_code == 302
    form = client.get(reverse("run-launch")).context["form"]
    data = {field.name: "" if field.value() is None else str(field.value()) for field in form
            if field.widget_type != "checkbox" or field.value()}
    data = {key: ("on" if value == "True" else value) for key, value in data.items()}
    data.update(SHORT, name="lr x kl", sweep=SPACE, sweep_method="grid", launch_sweep="")
    response = client.post(reverse("run-launch"), data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    sweep = Sweep.objects.get()
    try:
        wait_for(lambda: sweep_ended(sweep), timeout=600, what="the sweep's 6 runs", every=1)
    finally:
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=120,
                 what="the runs' threads to end")
    check_the_sweep(sweep)
    page = client.get(response.url)
    rows = page.context["table"]["rows"]
    assert all(row["held_out"] is not None for row in rows)
    chart = page.context["chart"]
    assert len(chart["runs"]) == 6 and all(len(run["values"]) == 3 for run in chart["runs"])
    assert json.dumps(chart)  # what the page's script draws
    compare = client.get(reverse("run-compare"), {"runs": [row["run"].pk for row in rows], "step": 3})
    task = compare.context["sample_tasks"][0][0]
    saved = client.post(reverse("report-save"), {"runs": ",".join(str(row["run"].pk) for row in rows),
                                                 "name": "lr x kl", "note": "n", "sample_task": task, "sample_step": 3})
    report = client.get(saved.url)
    assert report.status_code == 200 and len(report.context["sample_columns"]) == 6
    # Runs side by side share the taskset's sampling counts, so each rolls out its own tasks: a run
    # without this task says so (step None) rather than showing another's.
    columns = report.context["sample_columns"]
    assert any(column.rollouts for column in columns)
    assert all(bool(column.rollouts) == (column.step is not None) for column in columns)
    wait_for(lambda: len(mail.outbox) == 1, timeout=60, what="the email")
    assert mail.outbox[0].subject == "[rftweb] sweep 'lr x kl' ended: 6 completed"
