"""Resuming a failed or stopped run, and who holds a run's duties: services, controls, API, command.

The worker side (a resumed run training from its checkpoint) is in tests/workers/test_tasks.py and
tests/journeys/test_recovery.py."""
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from apps.runs import duties, holding, logs, services, supervision
from apps.runs.api import token_for
from apps.runs.controls import control_run, control_statuses
from apps.runs.live import publisher
from apps.runs.models import Checkpoint, MetricPoint, Run

Status = Run.Status
ERROR = "loop failed: RuntimeError: boom\n\nTraceback ..."


def beat(worker="w1", seconds_ago=0.0, **extra) -> dict:
    return {"at": (timezone.now() - timedelta(seconds=seconds_ago)).isoformat(), "worker": worker, **extra}


@pytest.fixture
def after_commit(django_capture_on_commit_callbacks):
    """Runs what a change leaves for after its commit: the start_run a resume queues (worker_queue
    records it) and the live updates (sent now, while this test's database is still there)."""

    @contextmanager
    def committed():
        with django_capture_on_commit_callbacks(execute=True):
            yield
        publisher.flush()

    return committed


@pytest.fixture
def failed_run(make_run):
    run = make_run(status=Status.FAILED, error=ERROR, trainer_step=7, explorer_step=8,
                   heartbeats={"loop": beat(ended=timezone.now().isoformat())}, finished_at=timezone.now())
    Checkpoint.objects.create(run=run, version=4, step=4, path="/data/runs/x/checkpoints/step_4")
    Checkpoint.objects.create(run=run, version=6, step=6, path="/data/runs/x/checkpoints/step_6")
    return run


def test_a_failed_run_is_queued_again_from_its_newest_checkpoint(failed_run, worker_queue, after_commit):
    with after_commit():
        services.resume_run(failed_run)
    run = Run.objects.get(pk=failed_run.pk)
    assert run.status == Status.QUEUED and run.finished_at is None
    assert run.error == ""  # the page no longer shows it as current...
    (resume,) = run.resumes  # ...it is history
    assert resume["after"] == "failed" and resume["error"] == ERROR
    assert resume["checkpoint"] == {"version": 6, "step": 6}
    assert run.heartbeats == {}  # the dead worker's duty blocks nobody
    # Same run, back at its checkpoint's trainer step at once, as its worker will take it (step 7 is
    # replayed); the explorer step stays where the checkpoint's file does not say another.
    assert run.trainer_step == 6 and run.explorer_step == 8
    assert worker_queue == [run.pk]  # start_run, once the resume committed
    assert services.describe_resume(run, "failed") == f"run {run.pk} resumes from checkpoint v6 (trainer step 6)"


def test_a_stopped_run_without_a_checkpoint_starts_again_from_step_0(make_run, worker_queue, after_commit):
    run = make_run(status=Status.STOPPED, trainer_step=2)
    with after_commit():
        services.resume_run(run)
    assert run.status == Status.QUEUED and run.resumes[0]["checkpoint"] is None
    assert "no checkpoint (none yet, or deleted): it starts again from step 0" in services.describe_resume(
        run, "stopped")
    assert worker_queue == [run.pk]


def test_a_paused_run_carries_on_in_place(make_run, worker_queue, after_commit):
    run = make_run(status=Status.PAUSED)
    with after_commit():
        services.resume_run(run)
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.resumes == [] and worker_queue == []
    assert services.describe_resume(run, "paused") == f"run {run.pk} carries on where it was paused"


@pytest.mark.parametrize("status", [Status.QUEUED, Status.STARTING, Status.RUNNING, Status.STOPPING, Status.COMPLETED])
def test_only_paused_failed_or_stopped_runs_resume(make_run, worker_queue, status):
    run = make_run(status=status)
    with pytest.raises(services.InvalidTransition, match=f"is {status}: only a paused, failed or stopped run"):
        services.resume_run(run)
    assert Run.objects.get(pk=run.pk).status == status and worker_queue == []


def test_resume_waits_for_a_worker_that_still_holds_a_duty(failed_run, worker_queue, settings):
    # Split duties: the trainer failed; the explorer's worker is still finishing its step.
    Run.objects.filter(pk=failed_run.pk).update(
        heartbeats={"trainer": beat("t", ended="x"), "explorer": beat("e", seconds_ago=1)}
    )
    with pytest.raises(services.InvalidTransition, match="worker e still holds its explorer duty"):
        services.resume_run(failed_run)
    assert Run.objects.get(pk=failed_run.pk).status == Status.FAILED and worker_queue == []
    # A worker silent for longer than the timeout is dead: it holds nothing.
    silent = beat("e", seconds_ago=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)
    Run.objects.filter(pk=failed_run.pk).update(heartbeats={"explorer": silent})
    services.resume_run(failed_run)
    assert failed_run.status == Status.QUEUED


def test_the_resume_control_is_offered_on_paused_failed_and_stopped_runs(failed_run, make_run, curator, worker_queue):
    assert set(control_statuses()["resume"]) == {"paused", "failed", "stopped"}
    other = make_run("other", status=Status.FAILED, owner=curator)
    with pytest.raises(PermissionDenied, match="only the owner"):
        control_run(other, "resume", failed_run.owner)
    control_run(failed_run, "resume", curator)  # curators control every run
    assert Run.objects.get(pk=failed_run.pk).status == Status.QUEUED


def test_api_resume(client, failed_run, make_run, researcher, worker_queue):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token_for(researcher)}"}
    response = client.post(reverse("api-run-resume", args=[failed_run.pk]), **headers)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued" and body["error"] == ""
    assert body["message"] == f"run {failed_run.pk} resumes from checkpoint v6 (trainer step 6)"
    assert body["resumes"][0]["error"] == ERROR
    done = make_run("done", status=Status.COMPLETED)
    refused = client.post(reverse("api-run-resume", args=[done.pk]), **headers)
    assert refused.status_code == 409 and refused.json() == {
        "error": "cannot resume run 'done': it is completed", "status": "completed"
    }


def test_the_snapshot_of_a_resumed_run_shows_no_stale_error(researcher_client, failed_run, worker_queue):
    snapshot = lambda: researcher_client.get(reverse("run-live", args=[failed_run.pk])).json()["run"]  # noqa: E731
    assert snapshot()["error"] == ERROR
    services.resume_run(failed_run)
    assert snapshot()["status"] == "queued" and snapshot()["error"] == ""


def test_rft_resume_command(failed_run, worker_queue, capsys):
    call_command("rft_resume", str(failed_run.pk))
    assert capsys.readouterr().out.strip() == f"run {failed_run.pk} resumes from checkpoint v6 (trainer step 6)"
    with pytest.raises(CommandError, match=f"run {failed_run.pk} is queued: only a paused, failed or stopped run"):
        call_command("rft_resume", str(failed_run.pk))
    with pytest.raises(CommandError, match="no run with id 999"):
        call_command("rft_resume", "999")


def test_replayed_steps_replace_their_metrics(make_run):
    run = make_run(status=Status.RUNNING)
    first = services.record_metrics(run, "trainer", 3, {"loss": 1.0})
    replayed = services.record_metrics(run, "trainer", 3, {"loss": 0.9})
    assert list(run.metrics.values_list("step", "values")) == [(3, {"loss": 0.9})]
    assert MetricPoint.objects.get().time == replayed.time > first.time  # when the step was last recorded


# ---- who holds a duty ----------------------------------------------------------------------------


def test_claim_duty_refuses_a_live_holder_and_inactive_runs(make_run, settings):
    timeout = settings.RFTWEB_HEARTBEAT_TIMEOUT
    run = make_run(status=Status.RUNNING, heartbeats={"loop": beat("w1")})
    assert not holding.claim_duty(run, "loop", "w2", timeout)  # w1 beats
    assert holding.claim_duty(run, "loop", "w1", timeout)  # its own duty again
    run.heartbeats = {"loop": beat("w1", seconds_ago=timeout + 1)}
    run.save()
    assert holding.claim_duty(run, "loop", "w2", timeout)  # w1 fell silent
    run.refresh_from_db()
    assert duties.holder(run, "loop") == "w2"
    assert holding.release_duty(run, "loop", "w2")
    assert holding.claim_duty(run, "loop", "w3", timeout)  # let go: anyone may take it
    for status in (Status.QUEUED, Status.FAILED, Status.STOPPED):
        stopped = make_run(f"r-{status}", status=status)
        assert not holding.claim_duty(stopped, "loop", "w1", timeout)
        assert Run.objects.get(pk=stopped.pk).heartbeats == {}


CONTAINER = "0798d727-e536-4f23-b44e-000000000000/pid:[4026532501]"  # a pid namespace of another boot


def test_a_worker_of_this_machine_whose_process_is_gone_holds_nothing(make_run, settings):
    """Its heartbeat need not expire: a killed worker's task, redelivered, is served at once."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    dead, alive = f"{socket.gethostname()}:{exited.pid}", f"{socket.gethostname()}:{os.getpid()}"
    here = duties.pid_namespace()
    assert duties.process_is_gone(dead, here) and not duties.process_is_gone(alive, here)
    assert not duties.process_is_gone(f"elsewhere:{exited.pid}", here)  # another machine's: unknown
    # Another pid namespace under this host name (a container on the host's network): its pid
    # is not this process table's.
    assert not duties.process_is_gone(dead, CONTAINER)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not reaped yet (as when its parent died)
    while open(f"/proc/{zombie.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    assert duties.process_is_gone(f"{socket.gethostname()}:{zombie.pid}", here)
    zombie.wait()
    run = make_run(status=Status.RUNNING, heartbeats={"loop": beat(dead) | {"pid_namespace": here}})
    assert duties.holder(run, "loop") == dead  # by name it still is the holder...
    assert duties.workers_holding(run) == {}  # ...but not a live one
    in_a_container = make_run("contained", status=Status.RUNNING,
                              heartbeats={"loop": beat(dead) | {"pid_namespace": CONTAINER}})
    assert duties.workers_holding(in_a_container) == {"loop": dead}  # its beat tells
    assert holding.claim_duty(run, "loop", alive, settings.RFTWEB_HEARTBEAT_TIMEOUT)


def test_a_worker_whose_duty_was_taken_stops_beating(make_run, settings):
    run = make_run(status=Status.RUNNING, heartbeats={"loop": beat("old")})
    assert holding.heartbeat(run, "loop", "old")
    holding.hand_over(run, "loop", limit=3)
    assert not holding.heartbeat(run, "loop", "old")  # it learns it lost the duty...
    assert holding.claim_duty(run, "loop", "new", settings.RFTWEB_HEARTBEAT_TIMEOUT)  # ...the new task takes it
    assert not holding.release_duty(run, "loop", "old", error="late failure")  # nor can it fail the run
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.error == "" and duties.holder(run, "loop") == "new"


def test_a_worker_checks_it_still_holds_its_duty_at_every_step(make_run):
    run = make_run(status=Status.RUNNING, heartbeats={"loop": beat("me")})
    assert holding.wait_while_paused(run, "loop", "me") == Status.RUNNING
    holding.hand_over(run, "loop", limit=3)  # the watchdog took me for dead
    with pytest.raises(holding.DutyLost, match="worker me no longer holds the loop duty"):
        holding.wait_while_paused(run, "loop", "me")


def test_a_failing_worker_lets_go_and_fails_the_run_at_once(make_run):
    run = make_run(status=Status.RUNNING, heartbeats={"loop": beat("w1")})
    assert holding.release_duty(run, "loop", "w1", error=ERROR)
    assert run.status == Status.FAILED and run.error == ERROR and duties.workers_holding(run) == {}


def test_stop_is_immediate_when_no_worker_holds_the_run(make_run, settings):
    held = make_run("held", status=Status.RUNNING)
    assert services.stop_run(held).status == Status.STOPPING  # its worker stops within a step
    with pytest.raises(services.InvalidTransition, match="already stopping"):
        services.stop_run(held)
    silent = beat(seconds_ago=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)
    dead = make_run("dead", status=Status.RUNNING, heartbeats={"loop": silent})
    assert services.stop_run(dead).status == Status.STOPPED  # its worker died: nobody to ask


def test_the_watchdog_stops_a_stopping_run_whose_workers_died(make_run, settings):
    silent = beat(seconds_ago=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)
    config = {"mode": "both", "synchronizer": {"method": "memory"}, "trainer": {"total_steps": 10}}
    dying = make_run("dying", status=Status.STOPPING, config=config, heartbeats={"loop": silent})
    alive = make_run("alive", status=Status.STOPPING, config=config)
    assert supervision.watchdog() == []
    assert Run.objects.get(pk=dying.pk).status == Status.STOPPED
    assert Run.objects.get(pk=alive.pk).status == Status.STOPPING  # its worker stops it


def test_a_duty_sent_on_says_why_in_the_runs_own_logs(make_run, settings):
    """A walkthrough killed a trainer's process: the run went on, and its Logs panel never said why
    (the line was in the Celery worker's log only)."""
    config = {"mode": "both", "synchronizer": {"method": "memory"}, "trainer": {"total_steps": 10}}
    silent = beat("w1", seconds_ago=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)
    lapsed = make_run("lapsed", status=Status.RUNNING, config=config, heartbeats={"loop": silent})
    assert supervision.watchdog() == [(lapsed.pk, "loop")]
    [line] = logs.read(supervision.run_dir(lapsed))["lines"]
    assert (line["duty"], line["level"]) == ("loop", "WARNING")
    silent_for = re.search(r"worker w1 sent no heartbeat for (\d+) s", line["message"])[1]
    assert int(silent_for) > settings.RFTWEB_HEARTBEAT_TIMEOUT
    # A process of this machine found gone is named as such, long before the timeout.
    gone = make_run("gone", status=Status.RUNNING, config=config,
                    heartbeats={"loop": beat(f"{socket.gethostname()}:{2**22 + 7}")  # no such pid
                                | {"pid_namespace": duties.pid_namespace()}})
    assert supervision.watchdog() == [(gone.pk, "loop")]
    [line] = logs.read(supervision.run_dir(gone))["lines"]
    assert f"the process of worker {socket.gethostname()}:{2**22 + 7} is gone (killed?)" in line["message"]

    killed = make_run("killed", status=Status.RUNNING, config=config, heartbeats={"loop": beat("w2", task="t1")})
    cause = "Worker exited prematurely: signal 9 (SIGKILL)"
    supervision.worker_lost("t1", killed.pk, "loop", cause=cause)
    [line] = logs.read(supervision.run_dir(killed))["lines"]
    assert line["message"].endswith(f"the process serving task t1 is gone: {cause}")


def test_the_watchdog_fails_a_run_whose_worker_keeps_dying(make_run, settings):
    """Each hand-over without a new trainer step counts; past RFTWEB_MAX_HANDOVERS the run fails,
    and its user resumes it."""
    settings.RFTWEB_MAX_HANDOVERS = 2
    config = {"mode": "both", "synchronizer": {"method": "memory"}, "trainer": {"total_steps": 10}}
    run = make_run(status=Status.RUNNING, config=config, trainer_step=5, heartbeats={"loop": beat("w1")})
    assert holding.hand_over(run, "loop", limit=2)
    holding.claim_duty(run, "loop", "w2", settings.RFTWEB_HEARTBEAT_TIMEOUT)
    assert holding.hand_over(run, "loop", limit=2)  # w2 died at the same step: the second in a row
    run.refresh_from_db()
    assert run.heartbeats["loop"]["handovers"] == 2
    w3_silent = {**run.heartbeats["loop"], "worker": "w3", "at": beat(seconds_ago=999)["at"]}
    Run.objects.filter(pk=run.pk).update(heartbeats={"loop": w3_silent})
    assert supervision.watchdog() == []  # the third: the run fails instead
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error == (
        "loop failed: its worker w3 stopped beating (killed? out of memory?) at trainer step 5, and the "
        "watchdog hands a duty on at most 2 time(s) in a row without progress. "
        "Resume the run to continue from its last checkpoint."
    )
    # Progress resets the count.
    progressed = make_run("progressed", status=Status.RUNNING, trainer_step=9,
                          heartbeats={"loop": beat("w1", handovers=2, handed_over_at_step=5)})
    assert holding.hand_over(progressed, "loop", limit=2)
    progressed.refresh_from_db()
    assert progressed.heartbeats["loop"]["handovers"] == 1


def test_embedded_the_watchdog_leaves_this_servers_own_slow_duties_alone(make_run, settings, monkeypatch):
    """Embedded, every duty is a thread of the server: a beat late because the machine is busy is
    no dead worker. Sending it on restarted a training run (the demo server's watchdog round, under
    CI's load with the tests' 6 s timeout). A duty of another process (an `rft_run --wait` that was
    killed) is still sent on."""
    monkeypatch.setattr(supervision, "enqueue", lambda *args, **kwargs: None)
    settings.RFTWEB_EMBEDDED = True
    config = {"mode": "both", "synchronizer": {"method": "memory"}, "trainer": {"total_steps": 10}}
    late = beat(supervision.worker_id(), seconds_ago=999)
    mine = make_run("mine", status=Status.RUNNING, config=config, heartbeats={"loop": late})
    gone = make_run("gone", status=Status.RUNNING, config=config,
                    heartbeats={"loop": beat("elsewhere:1", seconds_ago=999)})
    assert supervision.watchdog() == [(gone.pk, "loop")]
    mine.refresh_from_db()
    assert mine.heartbeats["loop"]["worker"] == supervision.worker_id()


def test_a_run_whose_taskset_is_gone_is_not_queued_to_fail(make_run, worker_queue):
    """A taskset renamed or deleted since the launch: the resume queued the run, which failed a
    second later ("Taskset matching query does not exist"). Now it is refused, naming the key."""
    from apps.tasksets.models import Task, Taskset

    addition = Taskset.objects.create(name="addition")
    Task.objects.create(taskset=addition, index=0, prompt="What is 1 + 1?", answer="2")
    run = make_run(status=Status.STOPPED, config={"buffer": {"taskset": "addition", "eval_taskset": "good-csv"}})
    gone = r"cannot be resumed: buffer.eval_taskset: no taskset named 'good-csv'.*renamed or deleted"
    with pytest.raises(services.InvalidTransition, match=gone):
        services.resume_run(run)
    assert Run.objects.get(pk=run.pk).status == Status.STOPPED and worker_queue == []
    # Emptied in the Task admin (before it refused): it queued, then failed at its first step, each Resume.
    Taskset.objects.create(name="good-csv")
    addition.tasks.all().delete()
    emptied = r"cannot be resumed: buffer.taskset: taskset 'addition' has no tasks \(they were deleted since it launch"
    with pytest.raises(services.InvalidTransition, match=emptied):
        services.resume_run(run)
    assert Run.objects.get(pk=run.pk).status == Status.STOPPED and worker_queue == []


def test_a_run_whose_expert_dataset_was_deleted_before_it_copied_it_is_not_queued_to_fail(make_run, worker_queue):
    """Stopped while queued, its dataset deleted: each Resume queued it, and it failed ("no expert
    dataset is named 'hx'"). A run that copied it goes on with its copy."""
    from apps.buffer.models import IMPORTED_GROUP, Experience

    run = make_run(status=Status.STOPPED, config={"mode": "train", "algorithm": {"name": "sft"},
                                                  "buffer": {"expert_dataset": "hx"}})
    refused = r"cannot be resumed: buffer.expert_dataset: no expert dataset is named 'hx' and the run had not copied"
    with pytest.raises(services.InvalidTransition, match=refused):
        services.resume_run(run)
    assert Run.objects.get(pk=run.pk).status == Status.STOPPED and worker_queue == []
    Experience.objects.create(run=run, group_id=f"{IMPORTED_GROUP}7", source="expert", response_text="r")
    services.resume_run(run)
    assert Run.objects.get(pk=run.pk).status == Status.QUEUED
