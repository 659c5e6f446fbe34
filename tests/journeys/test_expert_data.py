"""A curator imports expert data and a run trains on it: on the Experiences admin's *Import expert
data* page they upload a JSONL file of answers under the dataset name `sums-expert`, and a DPO
file of preference pairs as `sums-pairs`; the job pages follow each import to the end, and the
*Expert datasets* page lists both with their rows. On the launch form they pick algorithm sft and
`buffer.expert_dataset: sums-expert` (the form offers the datasets), launch, and the run trains on
its copy of the rows, tokenized for its model: the loss goes down, every copy was used, and the
Expert datasets page names the run. A DPO run on `sums-pairs` trains on the pairs the same way.

Full stack in Chromium at 1366x768 (daphne, Celery workers on default and train); embedded through
the same views (the import job and the runs on threads of this process, SQLite under `make
test-sqlite`-like settings are not needed: the embedded flag is what changes the paths).
With RFTWEB_JOURNEY_SHOTS=DIR the journey leaves its screenshots there."""
import json
import os
import re
import threading
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.buffer.models import IMPORTED_GROUP, BufferJob, Experience, ExpertDataset
from apps.runs.models import MetricPoint, Run
from apps.tasksets.services import load_builtin_tasksets
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]
SHOTS = os.environ.get("RFTWEB_JOURNEY_SHOTS")
ANSWERS = [{"prompt": f"What is {i} + {i}?", "response": f"The answer is {2 * i}."} for i in range(8)]
PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": f"{i + 1}", "rejected": f"{i + 2}, I think."} for i in range(6)]
# The launch page's SFT and DPO presets, made short runs of the tiny model a CPU trains in a
# minute: every step sees every row (8 answers, 6 pairs).
RUNS = {
    "sft": ("sft", {"buffer.expert_dataset": "sums-expert", "buffer.expert_taskset": "", "trainer.batch_size": "8",
                    "trainer.micro_batch_size": "8"}),
    # The preset trains on annotators' comparisons of its own answers (mode both): on imports alone, mode train.
    "dpo": ("dpo-human", {"mode": "train", "buffer.expert_dataset": "sums-pairs", "trainer.batch_size": "6",
                          "trainer.micro_batch_size": "12"}),
}
COMMON = {"model.path": "tiny", "trainer.total_steps": "6", "trainer.lr": "0.001", "trainer.save_interval": "0"}


def files(tmp_path) -> dict[str, Path]:
    written = {}
    for name, rows in (("sums-expert", ANSWERS), ("sums-pairs", PAIRS)):
        written[name] = tmp_path / f"{name}.jsonl"
        written[name].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return written


def losses(run: Run) -> list[float]:
    points = MetricPoint.objects.filter(run=run, role="trainer").order_by("step")
    return [point.values["loss"] for point in points]


def check_trained(run: Run, rows: int) -> None:
    """The run completed on its copy of the dataset, all of it used, and learnt from it."""
    run.refresh_from_db()
    assert run.status == "completed", run.error
    copies = Experience.objects.filter(run=run, group_id__startswith=IMPORTED_GROUP)
    assert copies.count() == rows and not copies.filter(prompt_ids=None).exists()
    used = copies.filter(rollout_index=0) if run.config["algorithm"]["name"] == "dpo" else copies
    assert not used.filter(use_count=0).exists()
    curve = losses(run)
    assert len(curve) == 6 and curve[-1] < curve[0] * 0.8, curve


def test_a_curator_imports_expert_data_and_pairs_and_runs_train_on_them(curator, stack, page, login, tmp_path):
    load_builtin_tasksets()
    processes = stack()
    processes.worker("default")
    processes.worker("train", slots=2)
    page.set_viewport_size({"width": 1366, "height": 768})
    login(curator, "/admin/buffer/experience/import/")
    for (name, path), layout in zip(files(tmp_path).items(), ("sft", "dpo")):
        page.goto("/admin/buffer/experience/import/")
        page.locator("input[name=file]").set_input_files(str(path))
        page.locator("input[name=dataset]").fill(name)
        page.locator("select[name=layout]").select_option(layout)
        page.get_by_role("button", name="Import").click()
        page.wait_for_url(re.compile(r"/admin/buffer/bufferjob/\d+/change/"))
        job = BufferJob.objects.order_by("-pk").first()
        wait_for(lambda job=job: BufferJob.objects.get(pk=job.pk).status == "succeeded", timeout=120,
                 what=f"the import of {name}")
        # The page reloads itself once the job has finished (job_progress.js: at once over its socket,
        # polled every 5 s behind it); a reload of the test's own aborted when the two met.
        expect(page.locator("body")).to_contain_text(f"into the new dataset '{name}'", timeout=15_000)
    page.goto("/admin/buffer/expertdataset/")
    expect(page.locator("#result_list")).to_contain_text("sums-expert")
    expect(page.locator("#result_list")).to_contain_text(f"{len(PAIRS)} pairs")  # not their 12 experiences
    shot(page, "expert-datasets")

    runs = {}
    for algorithm, (preset, fields) in RUNS.items():
        page.goto(f"/runs/new/?preset={preset}")
        page.get_by_label("Run name").fill(f"{algorithm} on imports")
        for key, value in {**COMMON, **fields}.items():
            field = page.locator(f"[name='{key}']")
            field.select_option(value) if field.evaluate("e => e.tagName") == "SELECT" else field.fill(value)
        if algorithm == "sft":
            page.locator("[name='buffer.taskset']").scroll_into_view_if_needed()
            shot(page, "launch-with-expert-dataset")
        page.get_by_role("button", name="Launch run").click()
        page.wait_for_url(re.compile(r"/runs/\d+/$"))
        runs[algorithm] = Run.objects.get(name=f"{algorithm} on imports")

    wait_for(lambda: all(Run.objects.get(pk=r.pk).status in ("completed", "failed") for r in runs.values()),
             timeout=600, what="the two runs", every=2)
    check_trained(runs["sft"], len(ANSWERS))
    check_trained(runs["dpo"], 2 * len(PAIRS))
    page.goto("/admin/buffer/expertdataset/")
    expect(page.locator("#result_list")).to_contain_text("sft on imports")
    expect(page.locator("#result_list")).to_contain_text("dpo on imports")
    shot(page, "expert-datasets-with-runs")


def test_embedded_the_same_imports_and_runs_through_the_same_pages(curator, settings, tmp_path):
    settings.RFTWEB_EMBEDDED = True
    load_builtin_tasksets()
    client = Client()
    client.force_login(curator)
    for (name, path), layout in zip(files(tmp_path).items(), ("sft", "dpo")):
        with open(path, "rb") as upload:
            response = client.post(reverse("admin:buffer_experience_import"),
                                   {"file": upload, "dataset": name, "layout": layout, "format": "auto"})
        assert response.status_code == 302, response.content.decode()[-2000:]
    wait_for(lambda: set(BufferJob.objects.values_list("status", flat=True)) == {"succeeded"}, timeout=120,
             what="the imports (threads of this process)")
    assert dict(ExpertDataset.objects.values_list("name", "layout")) == {"sums-expert": "sft", "sums-pairs": "dpo"}

    runs = {}
    for algorithm, (preset, fields) in RUNS.items():
        form = client.get(reverse("run-launch"), {"preset": preset}).context["form"]
        assert {"sums-expert", "sums-pairs"} <= {value for value, _ in form.fields["buffer.expert_dataset"].choices}
        initial = {field.name: "" if field.value() is None else str(field.value()) for field in form
                   if field.widget_type != "checkbox" or field.value()}
        initial = {key: ("on" if value == "True" else value) for key, value in initial.items()}
        data = {**initial, **COMMON, **fields, "name": f"{algorithm} on imports"}
        response = client.post(reverse("run-launch"), data)
        assert response.status_code == 302, response.context["form"].errors if response.context else response
        runs[algorithm] = Run.objects.get(name=f"{algorithm} on imports")
    try:
        wait_for(lambda: all(Run.objects.get(pk=r.pk).status in ("completed", "failed") for r in runs.values()),
                 timeout=600, what="the two runs", every=1)
    finally:
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=120,
                 what="the runs' threads to end")
    check_trained(runs["sft"], len(ANSWERS))
    check_trained(runs["dpo"], 2 * len(PAIRS))
    listing = client.get(reverse("admin:buffer_expertdataset_changelist")).content.decode()
    assert "sft on imports" in listing and "dpo on imports" in listing


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=Path(SHOTS) / f"{name}.png")
