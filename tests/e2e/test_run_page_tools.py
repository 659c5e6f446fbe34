"""The run page's daily tools in Chromium: Stop asks first (and the "Stopping" flash follows the run
to stopped), the Logs panel (errors first, tracebacks folded, a level filter; the resumed duty's
lines after a resume from elsewhere), the duty line (what the engine does, as the live channel says
it), the zero-variance hint, and the rollout browser (each response full width, the reference
answer beside it).
Screenshots at 1366x768 go to $RFTWEB_SCREENSHOTS (default test-artifacts/)."""
import logging
import re
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.runs import holding, services, supervision
from apps.runs.live import publisher
from apps.runs.logs import DutyLog
from apps.runs.models import MetricPoint, Run
from apps.runs.store import DjangoCheckpointStore
from apps.tasksets.models import Task, Taskset
from tests.support import taskset_with_a_task

from .test_dashboard import DEMO_CONFIG, SCREEN, SHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
log = logging.getLogger("workers.rft.loop")


def worker_beat() -> dict:
    return {"loop": {"at": timezone.now().isoformat(), "worker": "test-worker"}}


def running_run(owner, name="tools", **fields) -> Run:
    return Run.objects.create(name=name, owner=owner, status=Run.Status.RUNNING, config=DEMO_CONFIG,
                              heartbeats=worker_beat(), explorer_step=6, trainer_step=5, model_version=5, **fields)


def beat(*runs) -> None:
    """The runs' worker beats again before a Stop that must find it holding them: a run whose last
    beat is past RFTWEB_HEARTBEAT_TIMEOUT (6 s in the tests) stops at once, and CI's loaded machine
    took longer than that between making the run and clicking Stop run ("stopped", not "stopping")."""
    Run.objects.filter(pk__in=[run.pk for run in runs]).update(heartbeats=worker_beat())


def shares(run, values):
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, role="explorer", step=step, values={
            "reward_mean": 1.0, "advantage/zero_std_groups": round(8 * share), "advantage/compared_groups": 8,
            "advantage/zero_variance_groups": share})
        for step, share in enumerate(values, 1)
    )


def test_stop_asks_first_and_the_stopping_flash_follows_the_run_to_stopped(page, login, researcher, page_errors):
    run = running_run(researcher)
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator("#live-dot")).to_have_text("live")
    page.set_viewport_size(SCREEN)

    page.get_by_role("button", name="Stop").click()
    pop = page.locator(".confirm-pop")
    expect(pop).to_contain_text(f"Stop {isolate(run.name)}? The trainer saves a checkpoint")  # apps/core/bidi.py
    expect(page.get_by_role("button", name="Stop run")).to_be_focused()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "run-page-stop-confirm.png")
    page.get_by_role("button", name="Cancel").click()
    expect(pop).to_have_count(0)
    page.get_by_role("button", name="Stop").click()
    page.keyboard.press("Escape")
    expect(pop).to_have_count(0)
    run.refresh_from_db()
    assert run.status == "running"  # asking changed nothing

    beat(run)
    page.get_by_role("button", name="Stop").click()
    with page.expect_navigation():
        page.get_by_role("button", name="Stop run").click()
    expect(page.locator(".flash.success")).to_have_text(f"Stopping {run.name}.")
    expect(page.locator("#run-status")).to_have_text("stopping")
    run.refresh_from_db()
    assert run.status == "stopping"

    # The worker's last step: it saves a checkpoint and the run stops; the page says both without
    # a reload (its checkpoint table was the page's as first rendered: "No checkpoints yet").
    page.evaluate("window.e2eSamePage = true")
    expect(page.locator("#run-checkpoints tbody")).to_contain_text("No checkpoints yet")
    DjangoCheckpointStore(run).record(5, 5, "checkpoints/step_5")
    services.set_status(run, Run.Status.STOPPED)
    expect(page.locator("#run-status")).to_have_text("stopped", timeout=20_000)
    expect(page.locator("#run-checkpoints tbody tr")).to_have_count(1)
    expect(page.locator("#run-checkpoints tbody tr td").first).to_have_text("v5")
    expect(page.locator(".flash.success")).to_have_text(f"{run.name} stopped.")
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    assert page.evaluate("window.e2eSamePage") is True
    assert page_errors == []


def test_stop_selected_on_the_runs_list_asks_first_naming_how_many(page, login, researcher, page_errors):
    runs = [running_run(researcher, name=f"bulk {i}") for i in range(3)]
    login(researcher, "/runs/")

    for run in runs[:2]:
        page.locator(f'input[name="runs"][value="{run.pk}"]').check()
    page.get_by_role("button", name="Stop selected").click()
    expect(page.locator(".confirm-pop")).to_contain_text("Stop 2 selected runs? Each saves a checkpoint first")
    # Under the button, not a screen away at the foot of the table (a walkthrough's finding).
    button = page.get_by_role("button", name="Stop selected").bounding_box()
    pop = page.locator(".confirm-pop").bounding_box()
    assert 0 <= pop["y"] - (button["y"] + button["height"]) < 20 and abs(pop["x"] - button["x"]) < 20
    page.get_by_role("button", name="Cancel").click()
    assert {r.status for r in Run.objects.filter(pk__in=[r.pk for r in runs])} == {"running"}, "asking changed nothing"

    beat(*runs)
    page.get_by_role("button", name="Stop selected").click()
    with page.expect_navigation():
        page.get_by_role("button", name="Stop runs").click()
    assert [Run.objects.get(pk=r.pk).status for r in runs] == ["stopping", "stopping", "running"]
    assert page_errors == []


def test_the_logs_panel_shows_errors_first_folds_tracebacks_and_filters_by_level(page, login, researcher,
                                                                                   page_errors):
    run = running_run(researcher, name="logged")
    with DutyLog(supervision.run_dir(run), run.pk, "loop", secrets=[run.secret]):
        log.info("run %s (loop): from checkpoint v4 (trainer step 4)", run.pk)
        log.warning("heartbeat of run %s (loop) missed: connection reset", run.pk)
        try:
            raise RuntimeError(f"reward server refused {run.secret}")
        except RuntimeError:
            log.exception("explorer step 6: the reward fn raised")
        log.info("trainer step 5 saved")
    login(researcher, f"/runs/{run.pk}/")
    page.set_viewport_size(SCREEN)
    panel = page.locator("#run-logs")
    lines = panel.locator(".log-line")
    expect(lines).to_have_count(4)
    expect(lines.nth(0)).to_contain_text("explorer step 6: the reward fn raised")
    expect(lines.nth(0).locator(".log-level")).to_have_text("ERROR")
    expect(lines.nth(1)).to_contain_text("heartbeat of run")
    expect(lines.nth(2)).to_contain_text("trainer step 5 saved")  # then the newest first
    expect(panel.locator("[data-log-summary]")).to_contain_text("1 error · 1 warning · loop")
    traceback = lines.nth(0).locator("details.log-traceback")
    expect(traceback.locator("pre")).to_be_hidden()  # folded
    traceback.locator("summary").click()
    expect(traceback.locator("pre")).to_contain_text("RuntimeError: reward server refused [redacted]")
    assert run.secret not in panel.inner_text()
    panel.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "run-page-logs.png")

    panel.locator("[data-log-level]").select_option("error")
    expect(lines).to_have_count(1)
    panel.locator("[data-log-level]").select_option("info")
    expect(lines).to_have_count(4)
    # Active: the panel refreshes on its own.
    with DutyLog(supervision.run_dir(run), run.pk, "loop"):
        log.error("trainer step 6: loss is NaN")
    expect(lines.nth(0)).to_contain_text("loss is NaN", timeout=15_000)
    assert page_errors == []


def served_run(owner, worker: str, node: str, said: str) -> Run:
    """A run whose loop `worker` has taken and begun, logging `said` (take_duty)."""
    run = Run.objects.create(name="served", owner=owner, status=Run.Status.STARTING, config=DEMO_CONFIG)
    take_duty(run, worker, node, said)
    return run


def take_duty(run: Run, worker: str, node: str, said: str) -> None:
    """What a worker does as it serves the run's loop: claims it, logs `said`, begins its steps."""
    assert holding.claim_duty(run, "loop", worker, timeout=60, node=node)
    with DutyLog(supervision.run_dir(run), run.pk, "loop"):
        log.info(said)
    holding.mark_started(run, "loop", worker)


def test_a_run_resumed_from_elsewhere_shows_the_resumed_duty_on_the_open_page(page, login, researcher, page_errors):
    """The Logs panel and the duty line stopped asking at "stopped": a resume from the API,
    `rft_resume` or another tab brought the run back running on the open page with neither the
    resumed duty's lines nor its worker (seen on the full stack)."""
    run = served_run(researcher, "gpu-1:11", "train@one", "rollout engine: transformers")
    login(researcher, f"/runs/{run.pk}/")
    page.set_viewport_size(SCREEN)
    duty, lines = page.locator("#run-duties [data-duty=loop]"), page.locator("#run-logs .log-line")
    expect(duty).to_contain_text("on train@one")
    services.stop_run(run)
    with DutyLog(supervision.run_dir(run), run.pk, "loop"):
        log.info("run %s (loop): stopped at trainer step 5, checkpoint v5", run.pk)
    holding.release_duty(run, "loop", "gpu-1:11")  # the last duty of a stopping run to go stops it
    expect(page.locator("#run-status")).to_have_text("stopped")
    expect(lines.first).to_contain_text("stopped at trainer step 5")
    expect(page.locator("#run-duties")).to_be_hidden()

    for key in ("taskset", "eval_taskset", "expert_taskset"):  # a resume refuses a run whose tasksets are gone
        if (name := run.config["buffer"].get(key)) and not Taskset.objects.filter(name=name).exists():  # or empty
            taskset_with_a_task(name)
    services.resume_run(run)  # not from this page: it does not reload
    supervision.start_run(run.pk)
    take_duty(run, "gpu-2:12", "train@two", f"run {run.pk} (loop): resumed from checkpoint v5 (trainer step 5)")
    expect(page.locator("#run-status")).to_have_text("running")
    expect(lines.first).to_contain_text("resumed from checkpoint v5 (trainer step 5)")
    expect(duty).to_contain_text("on train@two")
    page.locator("#run-logs").scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "run-page-resumed-elsewhere.png")
    assert page_errors == []


def test_the_duty_line_says_what_the_engine_does_as_the_live_channel_tells_it(page, login, researcher, page_errors):
    """The duty line read what the engine does from the duty's heartbeat (every 10 s), polled every
    10 s: on the full stack it stood 6 s behind the step cards on median and 14 s at worst. Each
    change now comes over the run's live channel with the step's metrics, a long phase saying how
    long; a poll that read an older beat leaves it be."""
    run = served_run(researcher, "gpu-1:11", "train@one", "rollout engine: transformers")
    begun = time.time()
    holding.heartbeat(run, "loop", "gpu-1:11", [{"role": "explorer", "what": "rolling out step 6 with v5",
                                                  "since": begun}, {"role": "trainer", "what": "training step 5",
                                                                    "since": begun}])
    login(researcher, f"/runs/{run.pk}/")
    page.set_viewport_size(SCREEN)
    line = page.locator("#run-duties [data-duty=loop] .duty-detail")
    # A page that took a few seconds to open (a loaded machine) says how old the beat it read is.
    expect(line).to_contain_text(re.compile(
        r"rolling out step 6 with v5 · training step 5( \(as of \d+ s ago\))? · on train@one"))
    holding.heartbeat(run, "loop", "gpu-1:11")  # alive (a duty silent for 6 s is lost, in tests)
    now = time.time()
    publisher.publish(run.pk, {"type": "activity", "duty": "loop", "doing": [
        {"role": "explorer", "what": "rolling out step 7 with v6", "since": now},
        {"role": "trainer", "what": "saving a checkpoint at step 6", "since": now - 40}]})
    expect(line).to_contain_text(re.compile(
        r"rolling out step 7 with v6 · saving a checkpoint at step 6 \(4\d s\) · on train@one"), timeout=3000)
    page.screenshot(path=SHOTS / "run-page-duty-line.png")
    holding.heartbeat(run, "loop", "gpu-1:11")  # its beat still says step 6: polled, it is older
    page.wait_for_timeout(2500)  # two polls (every heartbeat interval: 1 s in tests)
    expect(line).to_contain_text("rolling out step 7 with v6")
    assert page_errors == []


def test_the_zero_variance_hint_shows_when_most_recent_groups_had_equal_rewards(page, login, researcher,
                                                                                 page_errors):
    flat = running_run(researcher, name="flat")
    shares(flat, [0.25, 0.5, 0.875, 0.875, 1.0, 0.875, 1.0])  # the last 5: 0.925, shown as 93%
    mixed = running_run(researcher, name="mixed")
    shares(mixed, [1.0, 1.0, 0.5, 0.25, 0.5])
    login(researcher, f"/runs/{flat.pk}/")
    page.set_viewport_size(SCREEN)
    hint = page.locator("#zero-variance-hint")
    # The demo's preset is MIX: there the hint says why it is expected early (issue #42, finding 7).
    expect(hint).to_have_text(
        "93% of groups had equal rewards in the last 5 explorer steps: they carry no learning signal (GRPO "
        "advantages are 0). Expected early in a MIX run: the expert half (SFT) teaches until the model's own "
        "answers start to differ. Later it means the tasks are all solved (or all failed) by the model: make them "
        "harder (or easier), or raise repeat_times or temperature. Or let buffer.task_selector difficulty_based "
        "draw the tasks the model passes about half the time.")
    page.screenshot(path=SHOTS / "run-page-zero-variance.png")
    grpo = running_run(researcher, name="grpo")
    Run.objects.filter(pk=grpo.pk).update(config={**grpo.config, "algorithm": {**grpo.config["algorithm"],
                                                                                "name": "grpo"}})
    shares(grpo, [0.875] * 5)
    page.goto(f"/runs/{grpo.pk}/")
    expect(hint).to_contain_text("advantages are 0). Make tasks harder or easier, raise repeat_times or "
                                 "temperature, or use a graded reward. Or let buffer.task_selector")
    # A run whose selector draws the tasks nearest its target (it logs selector/target_gap) is not told to.
    selecting = running_run(researcher, name="selecting")
    shares(selecting, [0.875] * 5)
    MetricPoint.objects.filter(run=selecting).update(values={"advantage/zero_variance_groups": 0.875,
                                                             "selector/target_gap": 0.5})
    page.goto(f"/runs/{selecting.pk}/")
    expect(hint).to_contain_text("or raise repeat_times or temperature.")
    expect(hint).not_to_contain_text("task_selector")
    page.goto(f"/runs/{mixed.pk}/")
    page.wait_for_function("() => window.rftRunPage?.board.series('explorer/advantage/zero_variance_groups', 'value')")
    expect(hint).to_be_hidden()
    assert page_errors == []


def test_the_rollout_browser_shows_each_response_full_width_with_the_reference_beside_it(page, login, researcher,
                                                                                         page_errors):
    run = running_run(researcher, name="rollouts")
    taskset = Taskset.objects.create(name="word-problems")
    task = Task.objects.create(taskset=taskset, index=3, prompt="Ann has 3 apples and buys 4 more. How many?",
                               answer="7")
    responses = ["Ann starts with 3 apples.\nShe buys 4 more: 3 + 4 = 7.\nThe answer is 7.",
                 "3 + 4 = 8, so Ann has 8 apples.", "Seven."]
    for i, (text, reward) in enumerate(zip(responses, (1.0, 0.0, 1.0))):
        Experience.objects.create(run=run, task=task, explorer_step=5, rollout_index=i, group_id="5-3",
                                  prompt_text=task.prompt, response_text=text, prompt_ids=[1], response_ids=[2] * 9,
                                  action_mask=[1] * 9, reward=reward, advantage=reward - 2 / 3, model_version=5,
                                  reward_components={"exact_match": reward})
    login(researcher, f"/runs/{run.pk}/rollouts/")
    page.set_viewport_size(SCREEN)
    articles = page.locator("article.response")
    expect(articles).to_have_count(3)
    first = articles.first
    # The response first, then its chips; the reference answer beside the responses.
    assert first.evaluate("a => a.firstElementChild.className") == "text"
    expect(first.locator(".text")).to_have_text(responses[0])
    reference = page.locator("aside.reference")
    expect(reference).to_contain_text("Reference answer · word-problems#3")
    expect(reference.locator(".text")).to_have_text("7")
    text_box, reference_box = first.locator(".text").bounding_box(), reference.bounding_box()
    assert reference_box["x"] >= text_box["x"] + text_box["width"]  # beside, not below
    assert text_box["width"] > 0.6 * SCREEN["width"]  # full width of the page, less the reference
    assert float(first.locator(".text").evaluate("e => getComputedStyle(e).fontSize")[:-2]) >= 14
    page.screenshot(path=SHOTS / "rollouts.png")
    assert page_errors == []


def test_a_researcher_whose_role_is_taken_away_reads_not_allowed_not_reconnecting(page, login, researcher, curator,
                                                                                  page_errors):
    """The socket closes (4401) and the page reconnects: the refused handshake shows the browser only
    1006, as a network gone does, and the page read "reconnecting…" for good. Its snapshot's 403 says
    which; a page whose socket dropped for other reasons reconnects as before (test_dashboard)."""
    from apps.accounts.services import set_roles

    run = running_run(researcher)
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator("#live-dot")).to_have_text("live")
    # From a thread of its own, as a curator's request would: Playwright's sync API runs an event
    # loop in this one, where the revocation's async_to_sync send cannot run.
    taken = threading.Thread(target=lambda: (set_roles(researcher, [], by=curator), connection.close()))
    taken.start()
    taken.join()
    expect(page.locator("#live-dot")).to_have_text("not allowed to watch", timeout=20_000)
    assert [error for error in page_errors if "403" not in error] == []
