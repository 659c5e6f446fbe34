"""Several explorers per run (explorer.engine_num) on real Celery explore workers over Postgres:
they share each explorer step group by group (store.DjangoStepClaims), the trainer gets what one
explorer would have stored, and a killed explorer's groups are rolled out by the other."""
import os
import signal

import psutil
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.runs import services, waits
from apps.runs.models import ExplorerGroup, ExplorerStep, Run
from apps.runs.supervision import run_dir
from tests.support import wait_for

from .test_tasks import REPEATS, TASKS, finished, grpo_config, make_taskset

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def shared_config(steps: int, engine_num: int, taskset: str, method: str = "checkpoint") -> dict:
    config = grpo_config(steps, method=method)  # explorers and trainer in workers of their own
    # Greedy: a group's rollouts are the same whichever explorer makes them.
    config["explorer"].update(engine_num=engine_num, temperature=0.0)
    config["buffer"]["taskset"] = taskset
    return config


def rollouts(run, steps: int | None = None) -> list[tuple]:
    """What was stored, by natural key, with the response; with `steps`, of the steps the
    trainer took (the explorer may have run a step further before the run ended)."""
    stored = Experience.objects.filter(run=run, source="rollout")
    if steps is not None:
        stored = stored.filter(explorer_step__lt=steps)
    return sorted(stored.values_list("explorer_step", "task_id", "rollout_index", "response_text"))


def explorer_workers(run) -> set[str]:
    return {part["worker"] for step in ExplorerStep.objects.filter(run=run) for part in step.parts}


@pytest.mark.parametrize("method", ["checkpoint", "nccl"])
def test_two_explorers_share_each_step_and_store_what_one_explorer_would(celery_worker_factory, researcher, method):
    """With either way of sending them the trainer's weights (nccl: a gloo group here), two
    explorers roll out what one explorer, loading versions from files, would."""
    make_taskset("arith")
    celery_worker_factory("default,train")
    celery_worker_factory("explore"), celery_worker_factory("explore")
    # 8 steps: an explorer resumes from the pause below within its poll's second of the other, and
    # on a quiet machine one had rolled out all of 4 steps by then (2 of 3 runs alone).
    steps = 8
    # The two-explorer run first, on two cold workers that load torch side by side. After the
    # one-explorer run, one worker would be warm and roll out all the steps alone while the other
    # still imported torch (seen on a busy machine): correct, but nothing shared.
    config = shared_config(steps, 2, "arith", method)
    config["explorer"]["eval_interval"] = 10  # only the ends: the first explorer's, with versions sent by nccl too
    # 4 held-out tasks: while the first explorer evaluated all 40 of arith at step 0, the other had
    # rolled out all 4 steps on a loaded machine (CI, nccl: nothing shared).
    make_taskset("arith-eval", n=4)
    config["buffer"]["eval_taskset"] = "arith-eval"
    two = services.launch_run(researcher, "two explorers", config)
    # Paused as it starts, until both explorers have loaded the model (their duty lines say so):
    # a worker that imported torch first had rolled out all 4 steps alone (seen once in three CI runs).
    wait_for(lambda: Run.objects.get(pk=two.pk).status == "running", what="the run starting", every=0.05)
    services.pause_run(two)
    wait_for(lambda: all("loaded the model" in state.detail or state.state == "paused"  # started, held
                         for state in waits.duty_states(Run.objects.get(pk=two.pk)) if state.duty != "trainer"),
             what="both explorers loaded")
    services.resume_run(two)
    wait_for(lambda: finished(two), what="the two-explorer run")
    # Draws are per run: this one picks its batches from the same start as the first.
    one = services.launch_run(researcher, "one explorer", shared_config(steps, 1, "arith"))
    wait_for(lambda: finished(one), what="the one-explorer run")
    assert (one.status, two.status) == ("completed", "completed"), (one.error, two.error)
    if method == "nccl":
        assert two.rendezvous["weights"] == {"generation": 1}  # one group, closed at the end
        assert not (run_dir(two) / "versions").exists()  # no version went through files

    stored = rollouts(two)
    assert len({key[:3] for key in stored}) == len(stored), "a rollout was stored twice"
    assert rollouts(two, steps) == rollouts(one, steps)  # the same groups, rollouts and responses, step by step
    assert len(explorer_workers(two)) == 2  # both explorers rolled out some of it
    assert explorer_workers(one) and len(explorer_workers(one)) == 1
    metrics = two.metrics.filter(role="explorer").order_by("step")
    assert [m.values["rollouts"] for m in metrics] == [TASKS * REPEATS] * len(metrics)
    assert all(m.values["written"] == TASKS * REPEATS for m in metrics)
    # The run page's "system · explorers" lines: each explorer's load time and idle share.
    named = {key.partition("/")[2] for m in metrics for key in m.values
             if key.startswith(("sync_seconds/", "idle_share/"))}
    assert named == {"explorer", "explorer-1"}
    # Each rollout names the explorer that wrote it (the rollouts page's chip: #42, finding 11).
    assert set(two.experiences.filter(source="rollout").values_list("metadata__explorer", flat=True)) == named
    evals = dict(two.metrics.filter(role="eval").values_list("step", "values"))
    assert {step: values["model_version"] for step, values in evals.items()} == {0: 0, steps: steps}


def test_a_killed_explorers_groups_are_rolled_out_by_the_other(celery_worker_factory, researcher):
    make_taskset("arith")
    celery_worker_factory("default,train")
    explorers = [celery_worker_factory("explore"), celery_worker_factory("explore")]
    steps = 6
    config = shared_config(steps, 2, "arith")
    # Shares of 4 groups of 4 rollouts of 64 tokens: a second or two of rolling out to kill it in.
    config["explorer"].update(batch_size=8, max_new_tokens=64)
    run = services.launch_run(researcher, "loses an explorer", config)
    claimed = wait_for(lambda: ExplorerGroup.objects.filter(explorer_step__run=run, done_at=None).exclude(worker="")
                       .first(), what="a claimed group", every=0.05)
    pid = int(claimed.worker.rpartition(":")[2])
    (victim,) = [w for w in explorers if pid in {w.pid, *(c.pid for c in psutil.Process(w.pid).children())}]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    claimed.refresh_from_db()
    assert claimed.done_at is None, "killed after it had finished its share: nothing was tested"
    wait_for(lambda: finished(run), what="completion with one explorer left")
    claimed.refresh_from_db()
    assert claimed.done_at is not None and claimed.worker not in ("", f"{claimed.worker.rpartition(':')[0]}:{pid}")
    assert run.status == "completed", run.error
    stored = rollouts(run)
    assert len({key[:3] for key in stored}) == len(stored)
    per_step = {}
    for step, *_ in stored:
        per_step[step] = per_step.get(step, 0) + 1
    assert set(per_step.values()) == {8 * REPEATS} and sorted(per_step) == list(range(len(per_step)))
    assert Run.objects.get(pk=run.pk).trainer_step == steps


def test_explorers_join_and_leave_while_the_run_trains(celery_worker_factory, researcher, researcher_client):
    """As its owner does it: the run page's Explorers field, while the run trains; then a stop."""
    make_taskset("arith")
    celery_worker_factory("default,train")
    celery_worker_factory("explore"), celery_worker_factory("explore")
    run = services.launch_run(researcher, "grows", shared_config(1000, 1, "arith"))  # stopped below
    wait_for(lambda: Run.objects.get(pk=run.pk).explorer_step >= 2, what="two steps with one explorer")
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'name="engine_num" value="1"' in page
    researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "2"})
    joined = wait_for(lambda: next((step for step in ExplorerStep.objects.filter(run=run, finished_at__isnull=False)
                                    if len({part["worker"] for part in step.parts}) == 2), None),
                      what="a step shared by two explorers")
    assert joined.step >= 2
    researcher_client.post(reverse("run-explorers", args=[run.pk]), {"engine_num": "1"})
    left = wait_for(lambda: Run.objects.get(pk=run.pk).heartbeats["explorer-1"].get("ended"),
                    what="explorer-1 to leave")
    alone = wait_for(lambda: ExplorerStep.objects.filter(run=run, opened_at__gt=left, finished_at__isnull=False)
                     .first(), what="a step after explorer-1 left")
    assert len({part["worker"] for part in alone.parts}) == 1  # one explorer again
    services.stop_run(run)
    wait_for(lambda: finished(run), what="the stop")
    assert run.status == "stopped", run.error
    done = list(ExplorerStep.objects.filter(run=run, finished_at__isnull=False).values_list("step", flat=True))
    stored = [key for key in rollouts(run) if key[0] in done]
    assert len({key[:3] for key in stored}) == len(stored) == len(done) * TASKS * REPEATS  # each once, none lost


def test_embedded_two_explorers_and_a_trainer_share_this_process(researcher, settings):
    """Embedded (`make demo` without Redis), a checkpoint-sync run's explorers and trainer are
    threads of one process: they load their models side by side, and the two explorers, one
    worker id between them, still split each step rather than both rolling out every group."""
    settings.RFTWEB_EMBEDDED = True
    make_taskset("arith")
    steps = 3
    config = shared_config(steps, 2, "arith")
    config["explorer"]["eval_interval"] = 2
    config["buffer"]["eval_taskset"] = "arith"
    run = services.launch_run(researcher, "embedded explorers", config)
    wait_for(lambda: finished(run), what="the embedded run")
    assert run.status == "completed", run.error
    # Held out: the starting weights, step 2 (with the version step 1 used) and the final version.
    evals = dict(run.metrics.filter(role="eval").values_list("step", "values"))
    assert {step: values["model_version"] for step, values in evals.items()} == {0: 0, 2: 1, steps: steps}
    # Each thread lets its duty go (before the test's database goes away under it).
    wait_for(lambda: all(beat.get("ended") for beat in Run.objects.get(pk=run.pk).heartbeats.values()),
             what="the threads to let their duties go")
    stored = rollouts(run)
    assert len({key[:3] for key in stored}) == len(stored), "a rollout was stored twice"
    for step in ExplorerStep.objects.filter(run=run, finished_at__isnull=False):
        assert sum(part["rollouts"] for part in step.parts) == TASKS * REPEATS, step.parts  # each group once
    assert Run.objects.get(pk=run.pk).trainer_step == steps


def test_an_nccl_run_that_loses_an_explorer_restarts_its_weight_group_and_completes(celery_worker_factory,
                                                                                   researcher):
    """nccl: a killed explorer breaks the weight group. The trainer's next publish names it, and
    its duty ends as a broken rank group's does; the watchdog (ticked here as the beat would)
    restarts the trainer from its checkpoint in a new group, which the live explorer and the dead
    one's replacement join. Every trainer step once, every rollout once."""
    from apps.runs import supervision

    make_taskset("arith")
    celery_worker_factory("default,train")
    explorers = [celery_worker_factory("explore") for _ in range(3)]  # two serve the run, one stands by
    steps = 8
    config = shared_config(steps, 2, "arith", "nccl")
    config["synchronizer"].update(timeout_s=5, verify_every=1)
    run = services.launch_run(researcher, "nccl loses an explorer", config)
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 2, what="two trainer steps", every=0.1)
    pid = int(Run.objects.get(pk=run.pk).heartbeats["explorer-1"]["worker"].rpartition(":")[2])
    (victim,) = [w for w in explorers if pid in {w.pid, *(c.pid for c in psutil.Process(w.pid).children())}]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert Run.objects.get(pk=run.pk).trainer_step < steps, "the run ended before the kill: nothing was tested"
    broke = wait_for(lambda: Run.objects.get(pk=run.pk).heartbeats["trainer"].get("broke"),
                     what="the weight group to break")
    assert broke.startswith("WeightSyncError") and f"explorer rank 2 (pid {pid})" in broke, broke

    def tick():
        supervision.watchdog()
        return finished(run)

    wait_for(tick, what="completion after the watchdog's restarts", every=1)
    assert run.status == "completed", run.error
    assert run.rendezvous["weights"]["generation"] >= 2  # a new group met
    trained = sorted(run.metrics.filter(role="trainer").values_list("step", flat=True))
    assert trained == list(range(1, steps + 1))
    stored = rollouts(run)
    assert len({key[:3] for key in stored}) == len(stored)
