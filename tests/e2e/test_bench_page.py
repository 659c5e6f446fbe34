"""A bench run's page in Chromium: its score arrives live on the key figure, named by its metric and
the model version it scored (not "explorer step 0"), and in its Evaluation card; the page, which
has no checkpoint table or feedback panel, runs its live updates without an error to the end.
A screenshot at 1366x768 goes to $RFTWEB_SCREENSHOTS (default test-artifacts/)."""
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from apps.runs import services
from apps.runs.models import Run
from workers.rft.config import RunConfig

from .test_dashboard import SCREEN, SHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_bench_runs_score_arrives_live_and_its_page_ends_cleanly(page, login, researcher, page_errors):
    config = RunConfig.from_dict({"mode": "bench", "buffer": {"taskset": "sums-eval", "eval_taskset": "sums-eval"}})
    run = Run.objects.create(name="eval tiny", owner=researcher, mode=Run.Mode.BENCH, status=Run.Status.RUNNING,
                             config=config.to_dict(), heartbeats={"loop": {"at": timezone.now().isoformat(),
                                                                           "worker": "test-worker"}})
    page.set_viewport_size(SCREEN)
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator("#live-dot")).to_have_text("live")
    expect(page.locator("[data-bench-empty]")).to_contain_text("No score yet")
    services.record_metrics(run, "eval", 0, {"exact_match": 0.625, "reward_mean": 0.7, "tasks": 40,
                                             "failed_tasks": 0, "model_version": 0})
    figure = page.locator('[data-figure="heldout"]')
    expect(figure.locator(".value")).to_have_text("0.625")
    expect(figure.locator(".sub")).to_have_text("exact_match · model v0")
    expect(page.locator("#bench-results [data-score]")).to_have_text("0.625")  # the card read again
    # Its chart's x is the model version it scored (Loop.bench), not an explorer step.
    expect(page.locator('[data-chart="eval/exact_match"] .g-xtitle')).to_have_text("model version evaluated")
    services.set_status(Run.objects.get(pk=run.pk), Run.Status.COMPLETED)
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator('[data-state="evaluation"]')).to_have_text("1")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "bench-run-page.png", full_page=True)
    assert page_errors == []
