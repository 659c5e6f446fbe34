"""Runs on real Celery workers over real Postgres and Redis: launch, watch live, complete, survive a kill."""
import os
import signal
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings

from apps.buffer.models import Experience
from apps.runs import duties, failures, services, supervision
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from rftweb.asgi import application
from rftweb.celery import enqueue
from tests.support import wait_for
from workers.rft import datasets

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASKS, REPEATS = 4, 4


def make_taskset(name="arith", n=40):
    taskset = Taskset.objects.create(name=name, task_count=n)
    Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=row["prompt"], answer=row["answer"], metadata=row["metadata"])
        for i, row in enumerate(datasets.generate("arithmetic", n, seed=0, max_operand=9))
    )
    return taskset


def grpo_config(steps: int, **sync) -> dict:
    return {
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": REPEATS},
        "explorer": {"batch_size": TASKS, "max_new_tokens": 8},
        "trainer": {"lr": 1e-3, "micro_batch_size": 16, "total_steps": steps, "save_interval": 1},
        "buffer": {"taskset": "arith"},
        "synchronizer": {"method": "memory", **sync},
    }


def finished(run):
    run.refresh_from_db()
    return run.is_finished


def session_cookie(client, user) -> bytes:
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


def test_grpo_run_completes_with_live_numbered_updates(celery_worker_factory, researcher, client):
    make_taskset()
    celery_worker_factory()
    cookie = session_cookie(client, researcher)
    steps = 3
    config = services.validate_config(grpo_config(steps)).to_dict()

    async def watch():
        from channels.db import database_sync_to_async

        # Launch after subscribing, so the client sees the run from its first update.
        run = await database_sync_to_async(Run.objects.create)(
            name="e2e", owner=researcher, config=config
        )
        ws = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/",
            headers=[(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)],
        )
        assert (await ws.connect())[0]
        await database_sync_to_async(enqueue)("workers.tasks.start_run", run.pk)
        messages = []
        while not any(u.get("status") in ("completed", "failed") for m in messages for u in m["updates"]):
            try:
                messages.append(await ws.receive_json_from(timeout=60))
            except Exception:
                print("DEBUG", messages)
                raise
        await ws.disconnect()
        return run, messages

    run, messages = async_to_sync(watch)()
    run.refresh_from_db()
    assert run.status == "completed", run.error
    # Numbered in order, none missing.
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    updates = [u for m in messages for u in m["updates"]]
    assert [u["status"] for u in updates if u["type"] == "status"] == ["starting", "running", "completed"]
    trainer_steps = [u["step"] for u in updates if u["type"] == "metrics" and u["role"] == "trainer"]
    assert trainer_steps == list(range(1, steps + 1))

    assert run.trainer_step == steps and run.explorer_step >= steps and run.model_version == steps
    assert Experience.objects.filter(run=run, source="rollout").count() == run.explorer_step * TASKS * REPEATS
    assert Experience.objects.filter(run=run, status="consumed").count() == steps * TASKS * REPEATS
    assert set(run.metrics.values_list("role", flat=True)) >= {"explorer", "trainer"}
    assert run.checkpoints.count() == steps
    assert all(os.path.isdir(path) for path in run.checkpoints.values_list("path", flat=True))


def test_stop_releases_the_worker_within_a_step(celery_worker_factory, researcher):
    make_taskset()
    celery_worker_factory()
    run = services.launch_run(researcher, "to stop", grpo_config(200))
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 1, what="first trainer step")
    services.stop_run(Run.objects.get(pk=run.pk))
    stopped_at = Run.objects.get(pk=run.pk).trainer_step
    wait_for(lambda: finished(run), timeout=60, what="stop")
    assert run.status == "stopped"
    assert run.trainer_step <= stopped_at + 1


def test_pause_holds_the_run_and_resume_continues(celery_worker_factory, researcher):
    make_taskset()
    celery_worker_factory()
    run = services.launch_run(researcher, "to pause", grpo_config(6))
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 1, what="first trainer step")
    services.pause_run(Run.objects.get(pk=run.pk))
    paused_at = Run.objects.get(pk=run.pk).trainer_step

    def steady(seconds=5):
        before = Run.objects.get(pk=run.pk).trainer_step
        time.sleep(seconds)
        return Run.objects.get(pk=run.pk).trainer_step == before

    wait_for(steady, timeout=60, what="the steps in flight to finish")
    held = Run.objects.get(pk=run.pk).trainer_step
    assert held <= paused_at + 2  # the explorer and trainer steps in flight, no more
    assert steady() and Run.objects.get(pk=run.pk).status == "paused"
    services.resume_run(Run.objects.get(pk=run.pk))
    wait_for(lambda: finished(run), what="completion")
    assert run.status == "completed" and run.trainer_step == 6


def test_a_killed_worker_is_replaced_and_nothing_is_lost_or_duplicated(celery_worker_factory, researcher):
    make_taskset()
    first = celery_worker_factory()
    steps = 8
    run = services.launch_run(researcher, "survivor", grpo_config(steps))
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 3, what="trainer step 3")
    os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool child, mid-run
    first.wait()
    killed_at = Run.objects.get(pk=run.pk).trainer_step
    assert killed_at < steps

    celery_worker_factory()
    wait_for(lambda: supervision.watchdog() == [(run.pk, "loop")], timeout=60, what="the watchdog to notice")
    wait_for(lambda: finished(run), what="completion after the kill")
    assert run.status == "completed", run.error
    assert run.trainer_step == steps

    rollouts = Experience.objects.filter(run=run, source="rollout")
    keys = list(rollouts.values_list("explorer_step", "task_id", "rollout_index"))
    assert len(keys) == len(set(keys))  # nothing duplicated
    per_step = {}
    for step, _, _ in keys:
        per_step[step] = per_step.get(step, 0) + 1
    assert sorted(per_step) == list(range(len(per_step)))  # no explorer step missing
    assert set(per_step.values()) == {TASKS * REPEATS}  # no rollout missing
    trainer_steps = list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True))
    assert trainer_steps == list(range(1, steps + 1))  # no gap, no repeat
    assert not run.metrics.filter(role="trainer", values__skipped=1).exists()  # replayed steps found their data


def test_a_failed_run_resumes_from_its_newest_checkpoint(celery_worker_factory, researcher):
    """The run fails saving step 3's checkpoint (a file sits where its directory goes). Once that is
    gone its user resumes it: the same run continues from checkpoint 2 and trains 3..5 once each."""
    make_taskset()
    celery_worker_factory()
    steps = 5
    config = services.validate_config(grpo_config(steps)).to_dict()
    run = Run.objects.create(name="fails", owner=researcher, config=config)
    blocker = supervision.run_dir(run) / "checkpoints" / "step_3"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a checkpoint")
    enqueue("workers.tasks.start_run", run.pk)
    wait_for(lambda: finished(run), what="the failure")
    assert run.status == "failed" and run.error.startswith("loop failed: NotADirectoryError"), run.error
    assert run.trainer_step == 3 and list(run.checkpoints.values_list("step", flat=True)) == [1, 2]
    assert duties.workers_holding(run) == {}  # the failed worker let go: resumable at once

    blocker.unlink()
    services.resume_run(run)
    # Queued, or already taken by the worker (resume_run reads the run back after the enqueue).
    assert run.status in ("queued", "starting", "running") and run.error == "", (run.status, run.error)
    wait_for(lambda: finished(run), what="completion after the resume")
    assert run.status == "completed", run.error
    (resume,) = run.resumes
    assert resume["checkpoint"] == {"version": 2, "step": 2}
    assert resume["error"].startswith("loop failed: NotADirectoryError")
    trainer_steps = list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True))
    assert trainer_steps == list(range(1, steps + 1))  # step 3 replayed in place: no repeat, no gap
    assert not run.metrics.filter(role="trainer", values__skipped=1).exists()
    rollouts = Experience.objects.filter(run=run, source="rollout")
    keys = list(rollouts.values_list("explorer_step", "task_id", "rollout_index"))
    assert len(keys) == len(set(keys))
    assert Experience.objects.filter(run=run, status="consumed").count() == steps * TASKS * REPEATS
    assert list(run.checkpoints.values_list("step", flat=True)) == [3, 4, 5]  # trainer.keep_checkpoints: 3
    assert sorted(os.listdir(supervision.run_dir(run) / "checkpoints")) == ["step_3", "step_4", "step_5"]


def test_a_stopped_run_resumes_where_it_stopped(celery_worker_factory, researcher):
    make_taskset()
    celery_worker_factory()
    steps = 12  # at 4, a quiet machine finished every step before the stop took effect
    run = services.launch_run(researcher, "stop and go", grpo_config(steps))
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 1, what="first trainer step")
    services.stop_run(Run.objects.get(pk=run.pk))
    wait_for(lambda: finished(run), timeout=60, what="stop")
    assert run.status == "stopped" and run.trainer_step < steps
    stopped_at = run.trainer_step
    assert run.checkpoints.order_by("-step").first().step == stopped_at  # saved on the stop
    services.resume_run(run)
    wait_for(lambda: finished(run), what="completion after the resume")
    assert run.status == "completed", run.error
    assert run.resumes[0]["checkpoint"]["step"] == stopped_at
    trainer_steps = list(run.metrics.filter(role="trainer").order_by("step").values_list("step", flat=True))
    assert trainer_steps == list(range(1, steps + 1))
    assert Experience.objects.filter(run=run, status="consumed").count() == steps * TASKS * REPEATS


@pytest.mark.parametrize(
    "sync, buffer, expected",
    [
        # One-step off-policy: from the second step on, every batch came from exactly the previous version.
        ({"interval": 1, "offset": 1}, {}, lambda s: s["staleness_min"] == s["staleness_max"] == 1),
        # Asynchronous: the explorer runs up to 3 versions ahead, the trainer takes nothing staler than 1.
        ({"interval": 1, "offset": 3}, {"max_staleness": 1}, lambda s: s["staleness_max"] <= 1),
    ],
    ids=["one-step-off-policy", "async-bounded-staleness"],
)
def test_synchronisation_modes_on_a_worker(celery_worker_factory, researcher, sync, buffer, expected):
    make_taskset()
    celery_worker_factory()
    config = grpo_config(5, **sync)
    config["buffer"].update(buffer)
    run = services.launch_run(researcher, "sync", config)
    wait_for(lambda: finished(run), what="completion")
    assert run.status == "completed", run.error
    trained = list(run.metrics.filter(role="trainer", step__gte=2).order_by("step").values_list("values", flat=True))
    assert len(trained) == 4 and all("staleness_max" in s and expected(s) for s in trained), trained


def test_explorer_and_trainer_on_separate_workers(celery_worker_factory, researcher):
    """Checkpoint sync: the duties run on an `explore` worker and a `train` worker, and still
    train synchronously: explorer step t used exactly version t (offset 0, interval 1). The held-out
    figure has both ends, as a single loop's: the starting weights and, before the run completes,
    the final version."""
    make_taskset()
    make_taskset("arith-eval", n=8)
    explore = celery_worker_factory(queues="default,explore")
    train = celery_worker_factory(queues="train")
    steps = 4
    config = grpo_config(steps, method="checkpoint")
    config["explorer"]["eval_interval"] = 10  # past the last step: only the ends
    config["buffer"]["eval_taskset"] = "arith-eval"
    run = services.launch_run(researcher, "split", config)
    wait_for(lambda: finished(run), what="completion")
    assert run.status == "completed", run.error
    evals = dict(run.metrics.filter(role="eval").values_list("step", "values"))
    assert {step: values["model_version"] for step, values in evals.items()} == {0: 0, steps: steps}
    assert all(values["tasks"] == 8 for values in evals.values())
    assert run.trainer_step == steps and run.model_version >= steps
    heartbeats = run.heartbeats
    assert heartbeats["explorer"]["worker"] != heartbeats["trainer"]["worker"]  # two processes
    # ... of the two Celery workers, as the Workers page names them
    assert (heartbeats["explorer"]["node"], heartbeats["trainer"]["node"]) == (explore.name, train.name)
    explored = dict(run.metrics.filter(role="explorer").values_list("step", "values"))
    used_versions = [explored[step]["model_version"] for step in sorted(explored)]
    assert used_versions[: steps] == list(range(steps))  # step t (1-based t+1) rolled out with version t
    trained = run.metrics.filter(role="trainer").values_list("values", flat=True)
    assert all(v["staleness_max"] == 0 for v in trained)
    assert Experience.objects.filter(run=run, status="consumed").count() == steps * TASKS * REPEATS


# ---- the failure message its user reads (issue #20, finding 7) ---------------------------------------


def failure_of(duty: str, exc: Exception, work_dir) -> str:
    """describe_failure as supervision.serve calls it: inside the except block, with a traceback at hand."""
    try:
        raise exc
    except type(exc) as raised:
        return failures.describe_failure(duty, raised, work_dir)


def test_a_failure_tells_its_user_the_cause_and_what_to_do_without_a_traceback_or_server_paths(tmp_path):
    work_dir = settings.DATA_DIR / "runs" / "7-20260101T000000000000"
    missing = work_dir / "checkpoints" / "step_3" / "weights.safetensors"
    error = failure_of("trainer", FileNotFoundError(2, "No such file or directory", str(missing)), work_dir)
    assert "Traceback" not in error and 'File "' not in error, error
    assert str(settings.DATA_DIR) not in error and str(settings.BASE_DIR) not in error, error
    assert error.startswith("trainer failed: FileNotFoundError: [Errno 2] No such file or directory: "), error
    assert "runs/7-20260101T000000000000/checkpoints/step_3/weights.safetensors" in error, error
    assert "worker's log" in error and "resume the run" in error, error


def test_a_full_disk_is_named_without_the_server_path(tmp_path):
    work_dir = settings.DATA_DIR / "runs" / "8-20260101T000000000000"
    error = failure_of("loop", OSError(28, "No space left on device"), work_dir)
    assert error == (
        "loop failed: the disk holding the run's directory (runs/8-20260101T000000000000 in the data directory) "
        "is full (no space left on device). Free space there, then resume the run: it continues from its last "
        "checkpoint."
    ), error
