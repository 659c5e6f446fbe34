"""Capacity as a person meets it (issue #27), full stack in Chromium: the only `train` slot is
busy with another run's loop; a researcher launches a run with two explorers (checkpoint sync:
a trainer and two explorers, each a duty of its own). The API answer warns what it will wait for;
its page says the trainer waits for a `train` worker and names the run holding the slot; the
explorers start on the `explore` worker. An operator starts a second `train` worker: the trainer
takes it and trains, and the Workers page lists both train workers with what each holds."""
import pytest
from django.test import Client
from playwright.sync_api import expect

from apps.runs import services
from apps.runs.api import token_for
from apps.runs.models import Run
from tests.support import make_taskset, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def config(**changes) -> dict:
    return {
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 4},
        "explorer": {"batch_size": 4, "max_new_tokens": 8},
        "trainer": {"lr": 1e-3, "micro_batch_size": 16, "total_steps": 400},
        "buffer": {"taskset": "arith"},
        **changes,
    }


def test_a_run_waiting_for_a_worker_names_what_holds_it_and_trains_once_one_comes(researcher, stack, page, login):
    make_taskset()
    processes = stack()
    processes.worker("default")  # jobs and the watchdog
    processes.worker("train", name="train-a@localhost")  # one slot
    processes.worker("explore", slots=2, name="explore@localhost")
    processes.beat()
    busy = services.launch_run(researcher, "busy", config())
    wait_for(lambda: Run.objects.get(pk=busy.pk).trainer_step >= 1, what="the busy run training", every=0.2)

    answer = Client().post(
        "/api/runs/", {"name": "wide", "config": config(
            synchronizer={"method": "checkpoint"}, explorer={"batch_size": 4, "max_new_tokens": 8, "engine_num": 2},
        )}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}",
    ).json()
    (warning,) = answer["warnings"]
    assert "needs 1 `train` slot(s) and 0 are free" in warning and f"run {busy.pk} busy (loop)" in warning
    wide = answer["id"]

    login(researcher, f"/runs/{wide}/")
    trainer = page.locator('[data-duty="trainer"]')
    expect(trainer).to_contain_text("waiting for a train worker")  # `train` shown as code
    expect(trainer).to_contain_text(f"run {busy.pk} busy (loop)")
    for explorer in ("explorer", "explorer-1"):
        expect(page.locator(f'[data-duty="{explorer}"] .duty-state')).to_have_text("running", timeout=90_000)
    expect(page.locator("[data-explorers-running]")).to_have_text("· 2 of 2 running")
    page.goto("/runs/")
    expect(page.locator("tr", has_text="wide")).to_contain_text("queued")

    processes.worker("train", name="train-b@localhost")  # the operator adds a machine
    page.goto(f"/runs/{wide}/")
    expect(page.locator('[data-duty="trainer"] .duty-state')).to_have_text("running", timeout=90_000)
    expect(page.locator('[data-duty="trainer"]')).to_contain_text("train-b@localhost")
    wait_for(lambda: Run.objects.get(pk=wide).trainer_step >= 1, what="the wide run training", every=0.2)

    page.goto("/workers/")
    for name, holds in (("train-a@localhost", "busy"), ("train-b@localhost", "wide"),
                        ("explore@localhost", "wide")):
        expect(page.locator(f'[data-worker="{name}"]')).to_contain_text(holds)
    # Free slots by queue (a free `default` slot does not help a run that waits for `train`), and
    # each machine's cores and memory, which a launch is checked against (issue #41, finding 3).
    expect(page.locator("[data-workers-summary]")).to_contain_text("train 0 of 2 free")
    expect(page.locator("[data-workers-summary]")).to_contain_text("explore 0 of 2 free")
    expect(page.locator('[data-worker="train-a@localhost"]')).to_contain_text(" GB · no GPU")
    for run in (busy.pk, wide):
        services.stop_run(Run.objects.get(pk=run))
