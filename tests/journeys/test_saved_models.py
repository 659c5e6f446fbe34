"""A researcher trains in two stages, as an SFT warm-up before RL is run: an SFT run on the built-in
addition taskset's expert answers completes; on its page's Checkpoints table they pick *Save as
model*, name it `sums-sft` and save; the Models page lists it with the run and step it came from.
Its *Train from it* opens the launch form with `model.path: models/sums-sft` and GRPO on its
taskset (the second stage, said on the page); they pick the SFT preset instead (the model stays),
launch, and the second run starts where the first ended: its first loss is the first run's last,
not its first. The Models page then names the second run as trained from
it, and deleting the model while nothing may load it again removes it and its files.

A researcher then scores a saved model: the quick demo's last checkpoint, saved, has its *Evaluate*
open a mode-bench run of it on the demo's eval taskset; launched, it scores the model as the demo
scored it at that step, and the Models page shows that score, linked to the bench run, sorted by it.

Full stack in Chromium at 1366x768 (daphne, Celery workers on default and train); embedded through
the same views (the runs on threads of this process). With RFTWEB_JOURNEY_SHOTS=DIR the journey
leaves its screenshots there."""
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.runs.models import MetricPoint, MetricSummary, Run
from apps.saved_models.models import SavedModel
from apps.saved_models.services import model_dir, models_root
from apps.tasksets.services import load_builtin_tasksets
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]
SHOTS = os.environ.get("RFTWEB_JOURNEY_SHOTS")
MODELS = ("sums-sft", "sums-demo")
EVAL_KEY = "exact_match"  # the quick demo's reward fn: 1 or 0 an answer, its mean the held-out accuracy
# The SFT preset made a short run of the tiny model on the addition taskset's expert answers.
SFT = {"buffer.taskset": "addition", "buffer.expert_taskset": "addition", "trainer.total_steps": "8",
       "trainer.lr": "0.001", "trainer.batch_size": "16", "trainer.micro_batch_size": "16",
       "trainer.save_interval": "0"}


@pytest.fixture(autouse=True)
def no_model_left():
    """The data dir outlives the test database: a failed try's model directory would refuse the name."""
    for name in MODELS:
        shutil.rmtree(models_root() / name, ignore_errors=True)
    yield
    for name in MODELS:
        shutil.rmtree(models_root() / name, ignore_errors=True)


def losses(run: Run) -> list[float]:
    return [p.values["loss"] for p in MetricPoint.objects.filter(run=run, role="trainer").order_by("step")]


def check_second_stage(first: Run, second: Run) -> None:
    """Both completed; the second started from the first's weights: its first loss is near the
    first's last, far below the first's first (a fresh tiny model's)."""
    for run in (first, second):
        run.refresh_from_db()
        assert run.status == "completed", run.error
    before, after = losses(first), losses(second)
    # Seen: 6.48 -> 3.37 over the first run, and 3.02 at the second's first step.
    assert len(before) == len(after) == 8 and before[-1] < before[0] * 0.7, before
    assert after[0] < (before[0] + before[-1]) / 2 and after[-1] < after[0], (before, after)
    assert second.config["model"]["path"] == str(model_dir(SavedModel.objects.get(name="sums-sft")))


def launch_in_browser(page, name: str, fields: dict) -> Run:
    """Fill the launch form open in `page` (its name, then `fields`), launch, and wait for the run to end."""
    page.get_by_label("Run name").fill(name)
    for key, value in fields.items():
        field = page.locator(f"[name='{key}']")
        field.select_option(value) if field.evaluate("e => e.tagName") == "SELECT" else field.fill(value)
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(name=name)
    wait_for(lambda: Run.objects.get(pk=run.pk).status in ("completed", "failed"), timeout=300,
             what=f"run {name}", every=2)
    return run


def launch_embedded(client, name: str, query: dict, fields: dict) -> Run:
    """Post the launch form as `query` opens it, `fields` changed, and wait for the run (on threads
    of this process) to end."""
    form = client.get(reverse("run-launch"), query).context["form"]
    initial = {field.name: "" if field.value() is None else str(field.value()) for field in form
               if field.widget_type != "checkbox" or field.value()}
    initial = {key: ("on" if value == "True" else value) for key, value in initial.items()}
    response = client.post(reverse("run-launch"), {**initial, **fields, "name": name})
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    run = Run.objects.get(name=name)
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status in ("completed", "failed"), timeout=300,
                 what=f"run {name}", every=1)
    finally:
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=120,
                 what="the run's threads to end")
    return run


def test_a_researcher_saves_an_sft_checkpoint_as_a_model_and_trains_from_it(researcher, stack, page, login):
    load_builtin_tasksets()
    processes = stack()
    processes.worker("default")
    processes.worker("train", slots=2)
    page.set_viewport_size({"width": 1366, "height": 768})
    login(researcher, "/runs/new/?preset=sft")

    def launch(name: str, fields: dict) -> Run:
        return launch_in_browser(page, name, fields)

    first = launch("sft warm-up", {"model.path": "tiny", **SFT})
    page.reload()
    checkpoints = page.locator("#run-checkpoints")
    expect(checkpoints).to_contain_text("Save as model")
    shot(page, "checkpoints")
    checkpoints.get_by_role("link", name="Save as model").first.click()
    page.get_by_label("Name").fill("sums-sft")
    page.get_by_label("Note").fill("8 SFT steps on the addition answers")
    shot(page, "save-as-model")
    page.get_by_role("button", name="Save model").click()
    page.wait_for_url("**/models/")
    row = page.locator("#model-sums-sft")
    expect(row).to_contain_text("sft warm-up")
    expect(row).to_contain_text("step 8")
    expect(page.locator(".messages, body")).to_contain_text("models/sums-sft")

    row.get_by_role("link", name="Train from it").click()
    expect(page.locator("[name='model.path']")).to_have_value("models/sums-sft")
    expect(page.locator("[name='algorithm.name']")).to_have_value("grpo")
    expect(page.locator("[name='buffer.taskset']")).to_have_value("addition")
    expect(page.locator("body")).to_contain_text("sums-sft is an SFT warm-up (run sft warm-up)")
    page.locator(".preset", has_text="SFT").first.click()  # the preset link keeps the model
    expect(page.locator("[name='model.path']")).to_have_value("models/sums-sft")
    second = launch("sft from sums-sft", SFT)
    check_second_stage(first, second)

    page.goto("/models/")
    expect(page.locator("#model-sums-sft")).to_contain_text("sft from sums-sft")
    shot(page, "models")
    page.goto(f"/runs/{first.pk}/")
    expect(page.locator("#run-checkpoints")).to_contain_text("saved as sums-sft")
    directory = model_dir(SavedModel.objects.get(name="sums-sft"))
    page.goto("/models/")
    page.locator("#model-sums-sft").get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Delete model").click()
    expect(page.locator("body")).to_contain_text("Deleted sums-sft")
    assert not SavedModel.objects.exists() and not directory.exists()


def test_embedded_the_same_two_stages_through_the_same_pages(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    client = Client()
    client.force_login(researcher)

    def launch(name: str, query: dict, fields: dict) -> Run:
        return launch_embedded(client, name, query, fields)

    first = launch("sft warm-up", {"preset": "sft"}, {"model.path": "tiny", **SFT})
    version = first.checkpoints.order_by("-version").first().version
    page = client.get(reverse("run-detail", args=[first.pk])).content.decode()
    assert reverse("model-save", args=[first.pk, version]) in page
    response = client.post(reverse("model-save", args=[first.pk, version]), {"name": "sums-sft", "note": ""})
    assert response.status_code == 302 and response.url == reverse("model-list")

    grpo = client.get(reverse("run-launch"), {"model": "sums-sft"}).context["form"]  # Train from it
    assert (grpo["model.path"].value(), grpo["algorithm.name"].value()) == ("models/sums-sft", "grpo")
    query = {"model": "sums-sft", "preset": "sft"}
    assert client.get(reverse("run-launch"), query).context["form"]["model.path"].value() == "models/sums-sft"
    second = launch("sft from sums-sft", query, SFT)
    check_second_stage(first, second)
    listing = client.get(reverse("model-list")).content.decode()
    assert "sft from sums-sft" in listing
    directory = model_dir(SavedModel.objects.get(name="sums-sft"))
    response = client.post(reverse("model-delete", args=["sums-sft"]))
    assert response.status_code == 302 and not SavedModel.objects.exists() and not directory.exists()


# The quick demo cut short: the tiny model learns addition for 10 steps, evaluated on addition-eval
# at its start and its end, where its one checkpoint is.
DEMO = {"trainer.total_steps": "10", "explorer.eval_interval": "10", "trainer.save_interval": "0"}


def bench_score(run: Run) -> float:
    """The bench run's score: its eval accuracy (the quick demo's reward fn scores 1 or 0)."""
    run.refresh_from_db()
    assert run.status == "completed" and run.mode == "bench", run.error
    return MetricSummary.objects.get(run=run, role="eval", key=EVAL_KEY).latest


def at_save(run: Run, step: int) -> float:
    return MetricPoint.objects.get(run=run, role="eval", step=step).values[EVAL_KEY]


def test_a_researcher_evaluates_a_saved_model_and_sees_its_score_on_the_models_page(researcher, stack, page, login):
    """Save the demo's last checkpoint as sums-demo; its row shows the demo's own eval at that step.
    Evaluate opens a mode-bench run of it on addition-eval (named and said so), which launches and
    scores it: the same greedy answers of the same weights on the same tasks as the demo's last eval,
    so the same score. The row then shows it, linked to that run, and sorts by it."""
    load_builtin_tasksets()
    processes = stack()
    processes.worker("default")
    processes.worker("train", slots=2)
    page.set_viewport_size({"width": 1366, "height": 768})
    login(researcher, "/runs/new/?preset=quick-demo")
    demo = launch_in_browser(page, "sums demo", DEMO)
    assert Run.objects.get(pk=demo.pk).status == "completed", Run.objects.get(pk=demo.pk).error
    page.reload()
    page.locator("#run-checkpoints").get_by_role("link", name="Save as model").first.click()
    page.get_by_label("Name").fill("sums-demo")
    page.get_by_role("button", name="Save model").click()
    page.wait_for_url("**/models/")
    row = page.locator("#model-sums-demo")
    step = SavedModel.objects.get(name="sums-demo").step
    expect(row.locator(".at-save")).to_have_text(f"at save {at_save(demo, step):.3f}")

    row.get_by_role("link", name="Evaluate").click()
    expect(page.locator("[name='mode']")).to_have_value("bench")
    expect(page.locator("[name='model.path']")).to_have_value("models/sums-demo")
    expect(page.locator("[name='buffer.eval_taskset']")).to_have_value("addition-eval")
    expect(page.get_by_label("Run name")).to_have_value("eval sums-demo on addition-eval")
    expect(page.locator("body")).to_contain_text("Evaluates sums-demo on addition-eval (mode bench")
    bench = launch_in_browser(page, "eval sums-demo on addition-eval", {})
    score = bench_score(bench)
    assert score == pytest.approx(at_save(demo, step)), "the same weights, greedy, on the same tasks"

    page.goto("/models/")
    cell = page.locator("#model-sums-demo td.score")
    expect(cell.locator("a.score-value")).to_have_text(f"{score:.3f}")
    expect(cell.locator("a.score-value")).to_have_attribute("href", f"/runs/{bench.pk}/")
    expect(page.locator("#model-sums-demo")).to_contain_text("eval sums-demo on addition-eval evaluated completed")
    page.locator("#saved-models thead").get_by_role("link", name="addition-eval").click()
    page.wait_for_url("**/models/?sort=addition-eval")
    expect(page.locator("#saved-models th.sorted")).to_contain_text("addition-eval")
    shot(page, "models-scores")


def test_embedded_the_same_evaluation_through_the_same_pages(researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    client = Client()
    client.force_login(researcher)
    demo = launch_embedded(client, "sums demo", {"preset": "quick-demo"}, DEMO)
    assert Run.objects.get(pk=demo.pk).status == "completed", Run.objects.get(pk=demo.pk).error
    version = demo.checkpoints.order_by("-version").first().version
    response = client.post(reverse("model-save", args=[demo.pk, version]), {"name": "sums-demo", "note": ""})
    assert response.status_code == 302
    saved = SavedModel.objects.get(name="sums-demo")
    assert "Not evaluated yet" not in client.get(reverse("model-list")).content.decode()  # the demo's own eval

    opened = client.get(reverse("run-launch"), {"evaluate": "sums-demo"})
    form = opened.context["form"]
    assert (form["mode"].value(), form["buffer.eval_taskset"].value()) == ("bench", "addition-eval")
    bench = launch_embedded(client, "eval sums-demo", {"evaluate": "sums-demo"}, {})
    score = bench_score(bench)
    assert score == pytest.approx(at_save(demo, saved.step))
    assert bench.config["model"]["path"] == str(model_dir(saved))

    page = client.get(reverse("model-list"), {"sort": "addition-eval"})
    row = page.content.decode().split('id="model-sums-demo"')[1].split("</tr>")[0]
    assert f'class="score-value" href="{reverse("run-detail", args=[bench.pk])}"' in row
    assert f">{score:.3f}</a>" in row
    listed = client.get(reverse("api-models")).json()["results"][0]["scores"]
    assert [(entry["source"], entry["run"], entry["value"]) for entry in listed] == [
        ("bench", bench.pk, score), ("at save", demo.pk, at_save(demo, saved.step))]


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=Path(SHOTS) / f"{name}.png")
