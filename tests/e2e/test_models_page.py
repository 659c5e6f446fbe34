"""The Models pages in Chromium at 1366x768 against the real server: a bench run still evaluating
shows in its score cell; a model's page sets an alias (moved from another model, said so), the
list filters by it; a rename refuses an empty name and a model a run would still load, then moves
it; the Evaluate form's
preset links keep a bench run of the model. Screenshots go to $RFTWEB_SCREENSHOTS (default
test-artifacts/)."""

import os
import re
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

from apps.runs.models import Checkpoint, Run
from apps.runs.supervision import run_dir
from apps.saved_models import services
from apps.saved_models.models import SavedModel
from apps.tasksets.models import Taskset

from .test_dashboard import DEMO_CONFIG

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCREEN = {"width": 1366, "height": 768}
SHOTS = Path(os.environ.get("RFTWEB_SCREENSHOTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


@pytest.fixture
def models(researcher):
    """Two models saved from one run's checkpoint, the first with a bench run evaluating it."""
    source = Run.objects.create(name="warm up", owner=researcher, config=DEMO_CONFIG, status=Run.Status.COMPLETED)
    directory = run_dir(source) / "checkpoints" / "step_5"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    Checkpoint.objects.create(run=source, version=5, step=5, path=str(directory))
    Taskset.objects.create(name="arithmetic-eval")  # the SmolLM2 GRPO preset's, offered by the form
    first = services.save_model(source, 5, "first", researcher)
    second = services.save_model(source, 5, "second", researcher)
    bench = Run.objects.create(name="eval first", owner=researcher, status=Run.Status.RUNNING, config={
        "mode": "bench", "model": {"path": str(services.model_dir(first))},
        "buffer": {"taskset": "sums-eval", "eval_taskset": "sums-eval"}})
    yield first, second, bench
    shutil.rmtree(run_dir(source), ignore_errors=True)
    for saved in SavedModel.objects.all():
        shutil.rmtree(services.model_dir(saved), ignore_errors=True)


def test_aliases_a_rename_and_a_running_bench_on_the_models_pages(page, login, researcher, models, page_errors):
    first, second, bench = models
    page.set_viewport_size(SCREEN)
    login(researcher, "/models/")

    # The bench run evaluating `first` is in its sums-eval cell, linked to the run.
    cell = page.locator("#model-first td.score")
    expect(cell.locator(".status.running")).to_have_text("running")
    expect(cell.locator(f'a[href="/runs/{bench.pk}/"]')).to_have_count(1)
    expect(page.locator("#model-second td.score")).to_contain_text("Not evaluated yet")

    # An alias set on one model, then on the other: it moves, said so.
    page.locator("#model-first").get_by_role("link", name="first", exact=True).click()
    expect(page).to_have_url(re.compile(r"/models/first/$"))
    page.get_by_label("Alias").fill("champion")
    page.get_by_role("button", name="Set alias").click()
    expect(page.locator(".flash")).to_have_text("first is champion now.")
    expect(page.locator("#model-aliases .chip")).to_have_text(["champion"])
    page.goto("/models/second/")
    page.get_by_label("Alias").fill("champion")
    page.get_by_role("button", name="Set alias").click()
    moved = "second is champion now, moved from first, which is no longer champion."
    expect(page.locator(".flash")).to_have_text(moved)
    page.screenshot(path=SHOTS / "model-page-alias.png")

    # The list shows it and filters by it.
    page.goto("/models/")
    page.locator("#model-second .chip", has_text="champion").click()
    expect(page).to_have_url(re.compile(r"/models/\?alias=champion$"))
    expect(page.locator("#saved-models tbody tr")).to_have_count(1)
    expect(page.locator("#saved-models tbody tr")).to_have_id("model-second")
    page.screenshot(path=SHOTS / "models-list-alias.png")

    # A rename: an empty name is refused, naming it, and so is one while the bench run would load
    # it by its path; once that run completed, the model and its page move.
    page.goto("/models/first/")
    page.get_by_label("New name").fill("")
    page.get_by_role("button", name="Rename").click()
    expect(page.locator(".flash.error")).to_have_text("Not renamed: a model's name is required: it was empty")
    page.get_by_label("New name").fill("first-v2")
    page.get_by_role("button", name="Rename").click()
    expect(page.locator(".flash.error")).to_contain_text(f"run eval first (#{bench.pk}, running) names models/first")
    Run.objects.filter(pk=bench.pk).update(status=Run.Status.COMPLETED)
    page.get_by_label("New name").fill("first-v2")
    page.get_by_role("button", name="Rename").click()
    expect(page).to_have_url(re.compile(r"/models/first-v2/$"))
    expect(page.locator("#model-name")).to_have_text("first-v2")
    expect(page.locator(".flash.success")).to_contain_text("Renamed first to first-v2")
    assert SavedModel.objects.get(pk=first.pk).name == "first-v2"

    # Evaluate, then a preset link: still a bench run of the model.
    page.get_by_role("link", name="Evaluate").click()
    expect(page.locator('[name="mode"]')).to_have_value("bench")
    page.locator(".presets a", has_text="SmolLM2 GRPO").click()
    expect(page).to_have_url(re.compile(r"preset=smollm2-grpo&evaluate=first-v2"))
    expect(page.locator('[name="mode"]')).to_have_value("bench")
    expect(page.locator('[name="model.path"]')).to_have_value("models/first-v2")
    expect(page.locator('[name="buffer.eval_taskset"]')).to_have_value("arithmetic-eval")
    assert page_errors == []
