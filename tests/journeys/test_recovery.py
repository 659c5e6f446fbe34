"""Failure and recovery: a run's worker is SIGKILLed mid-run, and the run still finishes, with
every trainer step exactly once.

The stack is the product's own processes, started as an operator starts them: a Celery worker and
Celery beat (whose watchdog looks after runs) on the test database and Redis. The run checkpoints
by time (`trainer.save_interval_s`), as the default config does, only more often.

(a) An operator's supervisor restarts the dead worker (the README's command: no `-l info`); the
    watchdog hands the run over to it and it trains on from the last checkpoint, its lines in the
    run page's Logs panel. Measured: seconds lost to the killed worker, from the kill to the first
    trainer step recorded again (printed; run with -s).
(b) A deployment that lets people decide (RFTWEB_MAX_HANDOVERS=0): the run fails, naming the dead
    worker; its user resumes it with `manage.py rft_resume RUN --wait`, which continues from the
    newest checkpoint.
(c) A trainer on two machines (trainer.num_nodes 2: two train workers, one rank each) loses one:
    the group breaks, and the watchdog restarts both machines' ranks from the checkpoint.
(d) The train worker is stopped in order (SIGTERM, as a service manager or `make demo` stops it):
    its duty saves at the step boundary and lets the run go; the worker exits without a traceback;
    the run waits for a worker, saying so, as long as it takes (the watchdog, on the jobs worker,
    does not count that as a crash loop). Then the rest of the stack stops too, and all of it
    starts again: the run carries on from the very step it stopped at.
(e) The same stop with a later run waiting for the one train slot: the run handed back keeps its
    place (apps/runs/turns.py) and gets the slot when the worker is back, though the later run's
    task was sent first; the later run is served once the first has finished.
(f) A run stopped while the worker that took its duty over replays the steps after the checkpoint:
    its log's stop line, its page and the API name the step that worker's trainer reached, not the
    one the killed worker had reached ("stopped at trainer step 92, checkpoint v70").

What the seconds lost are made of: restarting the worker, the watchdog's next tick
(RFTWEB_WATCHDOG_INTERVAL: 2 s here, 30 s by default), loading the model and replaying the steps
since the checkpoint. The watchdog sees at once that a worker of its own machine is gone; one on
another machine is presumed dead after RFTWEB_HEARTBEAT_TIMEOUT (6 s in tests, 120 s by default).
"""
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.runs import logs, services, supervision, waits
from apps.runs.models import MetricPoint, Run
from tests.e2e.test_dashboard import SCREEN, SHOTS
from tests.support import make_taskset, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
# 16 steps: with 8, a fast machine (a tiny-model step in ~0.3 s) could finish between the first
# checkpoint (2 s in) and the kill, and then nothing was tested.
TASKS, REPEATS, STEPS = 4, 4, 16


def config() -> dict:
    return {
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": REPEATS},
        "explorer": {"batch_size": TASKS, "max_new_tokens": 8},
        # A checkpoint every 3 steps, so the run trains past one whatever its speed. By time (2 s),
        # a loaded CI machine's steps took longer than 2 s: every step saved, and the run was never
        # seen past its newest checkpoint (both journeys timed out).
        "trainer": {"lr": 1e-3, "micro_batch_size": 16, "total_steps": STEPS, "save_interval": 3, "save_interval_s": 0},
        "buffer": {"taskset": "arith"},
    }


def sigkill(proc: subprocess.Popen) -> datetime:
    """kill -9 the worker and its pool child, mid-step; returns when."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return datetime.now(timezone.utc)


def run_row(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def kill_mid_run(worker, run) -> tuple[datetime, int]:
    """Once a checkpoint exists and the run has trained past it, kill its worker."""
    wait_for(lambda: run.checkpoints.exists() and run_row(run).trainer_step > run.checkpoints.order_by("-step")[0].step,
             what="training past a checkpoint", every=0.1)
    killed_at = sigkill(worker)
    trained = run_row(run).trainer_step
    assert trained < STEPS, "the run finished before the kill: nothing was tested"
    return killed_at, trained


def assert_each_step_once(run: Run) -> None:
    """What the person checks on the finished run: steps 1..N, each trained once, on each explorer
    step's rollouts, stored once."""
    run.refresh_from_db()
    assert run.status == "completed", run.error
    trainer_steps = list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True))
    assert trainer_steps == list(range(1, STEPS + 1)), f"missing or repeated trainer steps: {trainer_steps}"
    assert not run.metrics.filter(role="trainer", values__skipped=1).exists()  # every replayed step found its data
    rollouts = Experience.objects.filter(run=run, source="rollout")
    keys = list(rollouts.values_list("explorer_step", "task_id", "rollout_index"))
    assert len(keys) == len(set(keys)), "a rollout was stored twice"
    per_step = Counter(step for step, _, _ in keys)
    assert sorted(per_step) == list(range(len(per_step))) and set(per_step.values()) == {TASKS * REPEATS}
    assert Experience.objects.filter(run=run, status="consumed").count() == STEPS * TASKS * REPEATS


def test_a_killed_worker_is_replaced_by_the_watchdog_and_the_run_completes(researcher, stack, page, login):
    make_taskset()
    processes = stack()
    worker = processes.worker()
    processes.beat()
    run = services.launch_run(researcher, "survives a kill", config())
    killed_at, trained = kill_mid_run(worker, run)
    # What the run page polls every heartbeat interval says so as soon as the killed process is
    # gone (reaped): a worker of this machine is known lost at once, well before the
    # RFTWEB_HEARTBEAT_TIMEOUT (6 s here) after which one on another machine would be.
    wait_for(lambda: [s for s in waits.duty_states(run_row(run)) if s.state in ("lost", "handed over")],
             timeout=0.75 * float(processes.env["RFTWEB_HEARTBEAT_TIMEOUT"]), what="the loss shown", every=0.1)

    processes.worker(loglevel=None)  # the supervisor brings the worker back, started as the README says
    worker_back = (datetime.now(timezone.utc) - killed_at).total_seconds()
    first_again = wait_for(
        lambda: MetricPoint.objects.filter(run=run, role="trainer", time__gt=killed_at).order_by("time").first(),
        timeout=180, what="training again after the kill",
    )
    seconds_lost = (first_again.time - killed_at).total_seconds()
    resumed_from = run.checkpoints.filter(step__lt=first_again.step).order_by("-step").first()
    print(
        f"\nseconds lost to a killed worker: {seconds_lost:.1f} s (the new worker ready after {worker_back:.1f} s; "
        f"killed at trainer step {trained}, resumed from checkpoint step {resumed_from.step if resumed_from else 0}, "
        f"step {first_again.step} recorded again; watchdog every 2 s)"
    )
    # The new worker's lines on the run page: why the duty was sent on, and where its new worker
    # went on from (a worker started without `-l info` made no info line: the panel had nothing of it).
    login(researcher, f"/runs/{run.pk}/")
    page.set_viewport_size(SCREEN)
    panel = page.locator("#run-logs")
    expect(panel.locator(".log-line.warning")).to_contain_text(["is gone (killed?): the duty is sent on"])
    expect(panel).to_contain_text(f"(loop): resumed from checkpoint v{resumed_from.version} "
                                  f"(trainer step {resumed_from.step})")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "run-page-logs-after-handover.png")
    wait_for(lambda: run_row(run).is_finished, what="completion after the hand-over")
    assert_each_step_once(run)
    assert run.resumes == []  # handed over, not resumed by anyone
    assert seconds_lost < 120


def test_a_run_whose_worker_died_fails_and_its_user_resumes_it(researcher, stack):
    make_taskset()
    processes = stack(RFTWEB_MAX_HANDOVERS="0")
    worker = processes.worker()
    processes.beat()
    run = services.launch_run(researcher, "resumed by its user", config())
    kill_mid_run(worker, run)
    processes.worker()  # back, but the watchdog leaves the run to its user
    wait_for(lambda: run_row(run).status == "failed", timeout=120, what="the watchdog to fail the run")
    run.refresh_from_db()
    assert run.error.startswith("loop failed: its worker ") and "stopped beating (killed? out of memory?)" in run.error
    assert run.error.endswith("Resume the run to continue from its last checkpoint.")
    newest = run.checkpoints.order_by("-step").first()

    # What the user types, as the error says.
    resumed = subprocess.run(
        [sys.executable, "manage.py", "rft_resume", str(run.pk), "--wait"],
        cwd=ROOT, env=processes.env, capture_output=True, text=True, timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[0] == f"run {run.pk} resumes from checkpoint v{newest.version} (trainer step {newest.step})"
    assert lines[-1].startswith(f"run {run.pk} 'resumed by its user': completed  trainer {STEPS}/{STEPS}")
    assert_each_step_once(run)
    assert run.error == ""  # no stale error on the finished run...
    (resume,) = run.resumes  # ...it is in its history
    assert resume["after"] == "failed" and "stopped beating" in resume["error"]
    assert resume["checkpoint"] == {"version": newest.version, "step": newest.step}


def test_a_trainer_on_two_machines_restarts_its_group_when_one_dies(researcher, stack):
    """trainer.num_nodes 2 as two Celery train workers on this machine, one rank each, meeting
    through the run's record in Postgres; the second machine's worker is killed mid-run."""
    make_taskset()
    processes = stack(RFTWEB_NODE_ADDRESS="127.0.0.1")
    workers = [processes.worker(), processes.worker()]
    processes.beat()
    two_nodes = config()
    # 60 s: the survivor notices the dead rank within it; at 20 s the two ranks, each loading the model
    # in a fresh process, did not even join under a load of 10-15 on two cores.
    two_nodes["trainer"].update(strategy="ddp", num_nodes=2, collective_timeout_s=60)
    run = services.launch_run(researcher, "two machines", two_nodes)
    wait_for(lambda: run_row(run).trainer_step >= 1, what="the first step of the two machines", timeout=180)
    node_pid = int(run_row(run).heartbeats["trainer-node-1"]["worker"].rpartition(":")[2])
    (node_worker,) = [w for w in workers if node_pid in {w.pid, *(c.pid for c in psutil.Process(w.pid).children())}]
    assert run_row(run).heartbeats["loop"]["worker"] != run_row(run).heartbeats["trainer-node-1"]["worker"]

    kill_mid_run(node_worker, run)  # the machine of rank 1, with its rank
    processes.worker()  # its replacement
    wait_for(lambda: run_row(run).is_finished, timeout=300, what="completion after the group restarted")
    assert_each_step_once(run)
    assert run.resumes == []  # restarted by the watchdog, not by anyone
    group = run.rendezvous["trainer"]
    assert group.keys() == {"generation"} and group["generation"] >= 2  # a second group met


def test_a_worker_stopped_in_order_hands_its_run_back_and_a_new_one_carries_on(researcher, stack):
    make_taskset()
    processes = stack(RFTWEB_MAX_HANDOVERS="1")  # waiting for a worker must not count as a crash loop
    jobs = processes.worker("default")  # jobs and the watchdog, as make demo's jobs@ worker
    worker = processes.worker("train,explore")
    beat_process = processes.beat()
    run = services.launch_run(researcher, "survives a restart", config())
    wait_for(lambda: run_row(run).trainer_step >= 2, what="training", every=0.1)
    worker.send_signal(signal.SIGTERM)  # the main process only, as systemd, docker stop and make demo do
    worker.wait(timeout=60)
    stopped_at = datetime.now(timezone.utc)
    row = run_row(run)
    trained = row.trainer_step
    assert trained < STEPS, "the run finished before the stop: nothing was tested"
    log = processes.logs[worker.pid].read_text()
    assert "Traceback" not in log and "WorkerLostError" not in log, log[-3000:]
    assert row.status == "running" and row.error == ""
    beat = row.heartbeats["loop"]
    assert "is shutting down" in beat.get("handed_back", ""), beat  # let go, or already sent on by the watchdog
    assert row.checkpoints.filter(step=trained).exists(), "no checkpoint at the step it stopped at"
    # Longer than RFTWEB_MAX_HANDOVERS x the heartbeat timeout with no worker: it still waits, and says so.
    wait_for(lambda: run_row(run).heartbeats["loop"].get("handovers") == 0, what="the watchdog sending it on")
    time.sleep(3 * float(processes.env["RFTWEB_HEARTBEAT_TIMEOUT"]))
    row = run_row(run)
    assert row.status == "running" and waits.shown_status(row) == "waiting"
    (state,) = waits.duty_states(row)
    assert state.state == "handed over" and "none is live" in state.detail, state

    for process in (jobs, beat_process):  # the rest of the stack goes down too, in order
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert "Traceback" not in processes.logs[process.pid].read_text()
    processes.worker("default")  # and the whole stack comes back
    processes.worker("train,explore")
    processes.beat()
    first_again = wait_for(
        lambda: MetricPoint.objects.filter(run=run, role="trainer", time__gt=stopped_at).order_by("time").first(),
        timeout=180, what="training again after the restart",
    )
    assert first_again.step == trained + 1, "a step was trained again: it did not resume where it stopped"
    # Its page says where it went on from (issue #42, finding 6: only the worker's console did).
    went_on = run_row(run).heartbeats["loop"].get("from_checkpoint")  # kept once the duty ends, too
    assert went_on and went_on["step"] == trained, run_row(run).heartbeats
    wait_for(lambda: run_row(run).is_finished, what="completion after the restart")
    assert_each_step_once(run)
    assert run.resumes == []  # nobody had to resume it


def test_a_run_handed_back_by_a_restart_keeps_its_slot_ahead_of_a_run_launched_after_it(researcher, stack):
    """Issue #42, finding 3: after a full-stack stop and start, the demo run lost its train slot to
    runs launched after it and waited, its header saying "running · live"."""
    make_taskset()
    processes = stack()
    processes.worker("default")  # start_run and the watchdog
    processes.beat()
    name = "train@restarted"
    worker = processes.worker("train,explore", name=name)  # one slot
    first = services.launch_run(researcher, "first", config())
    wait_for(lambda: run_row(first).trainer_step >= 2, what="training", every=0.1)
    later = services.launch_run(researcher, "launched later", config())
    wait_for(lambda: run_row(later).queued_tasks, what="the later run's task sent")
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    stopped_at = datetime.now(timezone.utc)
    assert run_row(first).trainer_step < STEPS, "the run finished before the stop: nothing was tested"
    assert "loop" in run_row(first).queued_tasks  # sent again as it let go, keeping when it first asked

    processes.worker("train,explore", name=name)  # the broker hands it the later run's task first
    wait_for(lambda: MetricPoint.objects.filter(run=first, role="trainer", time__gt=stopped_at).exists(),
             timeout=180, what="the first run training again")
    row = run_row(later)
    assert "loop" not in row.heartbeats, "the run launched later took the slot"
    (state,) = waits.duty_states(row)
    assert state.state == "waiting" and "it is next" in state.detail, state
    wait_for(lambda: run_row(first).is_finished, what="the first run completing")
    wait_for(lambda: run_row(later).trainer_step >= 1, timeout=180, what="the later run served next")


def log_lines(run: Run) -> list[str]:
    return [line["message"] for line in logs.read(supervision.run_dir(run), limit=2000)["lines"]]


def test_a_run_stopped_during_the_replay_after_a_hand_over_names_the_step_its_trainer_reached(
        researcher, stack, page, login):
    make_taskset()
    processes = stack()
    worker = processes.worker()
    processes.beat()
    run = services.launch_run(researcher, "stopped in its replay", config())
    # Killed two steps past a checkpoint: the replay's first step is still behind the killed one's.
    newest = lambda: run.checkpoints.order_by("-step").values_list("step", flat=True).first()  # noqa: E731
    wait_for(lambda: newest() is not None and run_row(run).trainer_step == newest() + 2,
             what="two steps past a checkpoint", every=0.05)
    sigkill(worker)
    killed, checkpoint = run_row(run).trainer_step, newest()
    assert killed < STEPS, "the run finished before the kill: nothing was tested"
    services.pause_run(run)  # the new worker loads the checkpoint, then waits while the run is paused
    processes.worker()
    wait_for(lambda: f"run {run.pk} (loop): resumed from checkpoint v{checkpoint} (trainer step {checkpoint})"
             in log_lines(run), timeout=180, what="the new worker going on from the checkpoint")
    services.stop_run(run_row(run))  # it trains a step, saves a checkpoint there and stops
    wait_for(lambda: run_row(run).status == "stopped", what="the stop")

    run.refresh_from_db()
    reached = newest()
    assert checkpoint < reached < killed, f"killed at {killed}, resumed from {checkpoint}, stopped at {reached}"
    assert f"run {run.pk} (loop): stopped at trainer step {reached}, checkpoint v{reached}" in log_lines(run)
    assert run.trainer_step == reached
    assert list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True)) == \
        list(range(1, reached + 1))  # the lost steps' points went with them
    login(researcher, f"/runs/{run.pk}/")
    expect(page.locator('[data-state="trainer_step"]')).to_have_text(str(reached))
    expect(page.locator("#run-logs")).to_contain_text(f"stopped at trainer step {reached}, checkpoint v{reached}")
    assert page.request.get(f"/api/runs/{run.pk}/").json()["trainer_step"] == reached
