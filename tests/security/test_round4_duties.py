"""Issue 41, medium 5 and the second half of high 3: at most one queued task per duty, whatever a
run's page is made to do, and a duty whose worker process is killed twice fails its run instead of
being handed on again and again.

Before: toggling a run's explorers 32 <-> 1 (40 posts in 7 s) put 620 tasks in the explore queue
and 10 stop/resume cycles of a 32-explorer run added 352, all waiting ahead of other runs' work;
and Celery handed an out-of-memory launch's serve_duty task to the next pool process after each
kill (reject_on_worker_lost): 7 kills in 58 s across two train workers, until Stop. The queues
read here are the real Redis lists Celery's workers take from; the kills are real SIGKILLs of a
prefork worker's pool process."""
import base64
import json
import os
import signal
import time

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from apps.runs import duties, holding, services, supervision
from apps.runs.models import Run
from apps.runs.store import DjangoMetricSink
from apps.tasksets.models import Taskset
from rftweb.celery import app
from tests.support import wait_for
from tests.workers.test_tasks import grpo_config, make_taskset
from workers.rft.config import RunConfig

Status = Run.Status
EXPLORERS = 32  # the most explorer.engine_num allows
OOM = "Worker exited prematurely: signal 9 (SIGKILL) Job: 3."


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def queued(queue: str) -> int:
    """Tasks waiting in a Celery queue (kombu's Redis transport keeps each as a list of that name)."""
    return broker().llen(queue)


def queued_duties(queue: str) -> list[str]:
    """The duty each task waiting in `queue` serves (serve_duty's second argument)."""
    duties = []
    for raw in broker().lrange(queue, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == supervision.SERVE_TASK:
            args, _, _ = json.loads(base64.b64decode(message["body"]))
            duties.append(args[1])
    return duties


def beat(worker: str, **extra) -> dict:
    return {"at": timezone.now().isoformat(), "worker": worker, **extra}


def split_run(owner, explorers: int, status=Status.QUEUED, **fields) -> Run:
    config = RunConfig.from_dict(grpo_config(500, method="checkpoint")).to_dict()
    if not Taskset.objects.filter(name=config["buffer"]["taskset"]).exists():
        make_taskset(config["buffer"]["taskset"])  # a resume refuses a run whose taskset is gone
    config["explorer"]["engine_num"] = explorers
    return Run.objects.create(name="explorers", owner=owner, config=config, status=status, **fields)


def status_of(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


@pytest.fixture
def empty_broker(transactional_db):
    """The test's own Redis database, empty (as celery_worker_factory leaves it)."""
    broker().flushdb()


def test_toggling_explorers_32_and_1_forty_times_queues_one_task_per_duty(researcher, empty_broker):
    """The run page's explorer count posted 40 times, 32 and 1 in turn, while the explorer and the
    trainer are served (by workers elsewhere): the explore queue never holds more than the 31
    explorers no worker serves, each once; lowered to 1, it holds none of theirs."""
    run = split_run(researcher, 1, status=Status.RUNNING,
                    heartbeats={"explorer": beat("gpu-1:11"), "trainer": beat("gpu-2:22")})
    lengths = []
    for post in range(40):
        supervision.set_explorers(Run.objects.get(pk=run.pk), EXPLORERS if post % 2 == 0 else 1)
        lengths.append(queued("explore"))
    assert lengths == [EXPLORERS - 1, 0] * 20  # before: 31, 31, 62, 62, ... 620
    supervision.set_explorers(Run.objects.get(pk=run.pk), EXPLORERS)
    waiting = queued_duties("explore")
    assert sorted(waiting) == sorted(f"explorer-{k}" for k in range(1, EXPLORERS))  # each once
    assert queued("train") == 0  # the trainer is served: never sent again
    run.refresh_from_db()
    assert set(run.queued_tasks) == set(waiting)


def test_ten_stop_resume_cycles_queue_one_task_per_duty_and_a_stop_withdraws_them(researcher, empty_broker):
    """A 32-explorer run that no worker has taken yet, stopped and resumed ten times: each stop
    takes its 33 tasks back out of the queues, each resume sends them once. One a worker had
    already taken when it stopped is not sent again: that worker's task serves it."""
    run = split_run(researcher, EXPLORERS)
    supervision.start_run(run.pk)  # what the start_run task does on a worker
    assert (queued("explore"), queued("train")) == (EXPLORERS, 1)
    for _ in range(10):
        services.stop_run(Run.objects.get(pk=run.pk))  # no worker holds it: stopped at once
        assert status_of(run) == Status.STOPPED
        assert (queued("explore"), queued("train")) == (0, 0)
        services.resume_run(Run.objects.get(pk=run.pk))
        supervision.start_run(run.pk)
        assert (queued("explore"), queued("train")) == (EXPLORERS, 1)  # before: +33 a cycle, 352 at the end

    # A worker takes the first task (kombu keeps it among its unacknowledged messages), then a stop.
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        taken = channel.basic_get("explore", no_ack=False)
        task = taken.headers["id"]
        duty = next(duty for duty, sent in Run.objects.get(pk=run.pk).queued_tasks.items() if sent["task"] == task)
        services.stop_run(Run.objects.get(pk=run.pk))
        assert queued("explore") == 0
        assert set(Run.objects.get(pk=run.pk).queued_tasks) == {duty}  # it is on its way
        services.resume_run(Run.objects.get(pk=run.pk))
        supervision.start_run(run.pk)
        assert queued("explore") == EXPLORERS - 1 and duty not in queued_duties("explore")
        # The task comes: it claims its duty (for a worker elsewhere), and is counted queued no more.
        assert holding.claim_duty(run, duty, "gpu-3:33", settings.RFTWEB_HEARTBEAT_TIMEOUT, task=task)
        channel.basic_ack(taken.delivery_tag)
    run.refresh_from_db()
    assert duty not in run.queued_tasks and run.heartbeats[duty]["task"] == task


@pytest.mark.django_db
def test_a_duty_killed_twice_at_the_same_step_fails_its_run_saying_so(researcher):
    """worker_lost, as the Celery worker's main process calls it after each kill: the first kill
    hands the duty on (once: a duplicate task's kill changes nothing); the second at the same
    trainer step fails the run, and the researcher reads why on the run page."""
    run = Run.objects.create(name="oom", owner=researcher, config={}, status=Status.RUNNING,
                             heartbeats={"loop": beat("gpu-1:11", task="t1")})
    assert not holding.worker_lost(run, "loop", "t-duplicate", OOM)  # it held nothing
    assert holding.worker_lost(run, "loop", "t1", OOM)
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    assert run.heartbeats["loop"] | {"at": None, "handed_over_at": None} == {
        "at": None, "worker": duties.HANDED_OVER, "handovers": 1, "handed_over_at_step": 0, "handed_over_at": None,
        "task": "t1", "kills": 1, "lost": OOM}
    assert holding.claim_duty(run, "loop", "gpu-1:12", settings.RFTWEB_HEARTBEAT_TIMEOUT, task="t2")
    assert not holding.worker_lost(run, "loop", "t2", OOM)
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.error.startswith("loop failed: the worker serving loop was killed twice (signal 9: out of memory?), "
                                "with no step done in between (the run is at trainer step 0), so it is not handed "
                                "to another worker again.")
    assert "resume it: it continues from its last checkpoint" in run.error


@pytest.mark.django_db
def test_a_kill_the_watchdog_saw_first_counts_once_and_a_step_between_kills_resets_the_count(researcher, settings):
    """The watchdog may hand a killed worker's duty on (its process is gone) before Celery reports
    the kill: that is one loss, counted once, and not sent twice. A trainer step between two kills
    is progress: the count starts again."""
    run = Run.objects.create(name="oom", owner=researcher, config={}, status=Status.RUNNING,
                             heartbeats={"loop": beat("gpu-1:11", task="t1")})
    assert holding.hand_over(run, "loop", settings.RFTWEB_MAX_HANDOVERS)
    assert holding.worker_lost(run, "loop", "t1", OOM)
    run.refresh_from_db()
    assert (run.heartbeats["loop"]["handovers"], run.heartbeats["loop"]["kills"]) == (1, 1)
    holding.claim_duty(run, "loop", "gpu-1:12", settings.RFTWEB_HEARTBEAT_TIMEOUT, task="t2")
    DjangoMetricSink(run).log("trainer", 1, {"loss": 0.5})  # as the trainer logs a step
    assert holding.worker_lost(Run.objects.get(pk=run.pk), "loop", "t2", OOM)
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.heartbeats["loop"]["kills"] == 1


@pytest.mark.django_db
def test_a_replayed_step_between_two_kills_is_progress(researcher, settings):
    """Killed at trainer step 189, the loop's replacement restores checkpoint v160 and replays; a
    kill at its step 169 is not the same step as the first: trainer_step stayed at 189 (it never
    goes back), and the run failed saying 'killed twice at trainer step 189 each time'. A replayed
    step between the kills counts; two kills with no step at all between them still fail it."""
    run = Run.objects.create(name="replay", owner=researcher, config={}, status=Status.RUNNING, trainer_step=189,
                             heartbeats={"loop": beat("gpu-1:11", task="t1")})
    assert holding.worker_lost(run, "loop", "t1", OOM)
    holding.claim_duty(run, "loop", "gpu-1:12", settings.RFTWEB_HEARTBEAT_TIMEOUT, task="t2")
    for step in range(161, 170):  # the replay, below the run's trainer_step
        DjangoMetricSink(run).log("trainer", step, {"loss": 0.5})
    assert Run.objects.get(pk=run.pk).trainer_step == 189
    assert holding.worker_lost(Run.objects.get(pk=run.pk), "loop", "t2", OOM)
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.heartbeats["loop"]["kills"] == 1
    holding.claim_duty(run, "loop", "gpu-1:13", settings.RFTWEB_HEARTBEAT_TIMEOUT, task="t3")
    assert not holding.worker_lost(Run.objects.get(pk=run.pk), "loop", "t3", OOM)  # no step since
    assert Run.objects.get(pk=run.pk).status == Status.FAILED


def test_a_signal_other_than_9_or_an_exit_is_named_as_it_is():
    from apps.runs.failures import describe_lost_worker

    segv = describe_lost_worker("trainer", "Worker exited prematurely: signal 11 (SIGSEGV) Job: 7.", 2, 4)
    assert segv.startswith("trainer failed: the worker serving trainer was killed twice (signal 11, SIGSEGV), "
                           "with no step done in between (the run is at trainer step 4)")
    exited = describe_lost_worker("explorer-3", "Worker exited prematurely: exitcode 1 Job: 7.", 2, 0)
    assert "was lost twice (exit code 1)" in exited and "out of memory" not in exited


def serving_process(run: Run, duty: str, other_than: int | None = None) -> int | None:
    """The pid of the worker process holding the duty (alive, not `other_than`), else None."""
    held = duties.workers_holding(Run.objects.get(pk=run.pk)).get(duty)
    pid = held and int(held.rpartition(":")[2])
    return pid if pid and pid != other_than else None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_duty_whose_pool_process_is_killed_twice_fails_its_run_and_is_not_handed_on_again(
        celery_worker_factory, researcher):
    """A real prefork worker; its pool process serving the run's loop is SIGKILLed (as the kernel's
    out-of-memory killer does) as soon as it holds the duty, twice at one trainer step. The first
    kill hands the duty to the next pool process; the second fails the run with the reason, and no
    further process is given it. Before, Celery handed the task on after every kill, for ever."""
    make_taskset()
    worker = celery_worker_factory("default,train")
    run = services.launch_run(researcher, "out of memory", grpo_config(200))
    first = wait_for(lambda: serving_process(run, "loop"), timeout=120, what="a pool process to hold the loop")
    os.kill(first, signal.SIGKILL)
    holder = wait_for(lambda: serving_process(run, "loop", other_than=first), timeout=120,
                      what="the next pool process to hold the loop")
    beat = Run.objects.get(pk=run.pk).heartbeats["loop"]
    assert beat["kills"] == 1
    # Kills count while no trainer step comes between them (the same step each time: out of
    # memory). The tiny model's step takes under a second, so the process killed next may have
    # made one before this test saw it holding the duty (once in a loaded CI run): then the duty
    # is rightly handed on, its count started again, and the process after it is killed too.
    for _ in range(4):
        os.kill(holder, signal.SIGKILL)
        killed = time.monotonic()
        held_at = beat["handed_over_at"]
        outcome = wait_for(lambda killed_pid=holder: status_of(run) == Status.FAILED
                           or serving_process(run, "loop", other_than=killed_pid),
                           timeout=60, what="the run to fail, or the loop to be handed on after a trainer step")
        if outcome is True:
            break
        beat = Run.objects.get(pk=run.pk).heartbeats["loop"]
        assert beat["kills"] == 1 and beat["handed_over_at"] > held_at, beat  # handed on only after a step
        holder = outcome
    else:
        pytest.fail(f"the loop was still handed on after 5 kills, each after a trainer step: {beat}")
    print(f"failed {time.monotonic() - killed:.1f} s after the last kill")
    run.refresh_from_db()
    assert run.error.startswith("loop failed: the worker serving loop was killed twice (signal 9: out of memory?)")
    time.sleep(15)  # past Celery's worker_lost_wait (10 s): a requeued task would be served by now
    run.refresh_from_db()
    assert run.heartbeats["loop"]["worker"].endswith(f":{holder}") and run.status == Status.FAILED
    assert queued("train") == 0 and broker().hlen("unacked") == 0  # nothing left to hand on
    assert worker.log_path.read_text().count("signal 9 (SIGKILL)") >= 2
