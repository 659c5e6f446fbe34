"""Issue 30, high 3 and medium 6: Stop ends any run within a heartbeat or two, however many duty
tasks it has queued, and the watchdog never sends again a duty that no worker has claimed.

The schema now bounds trainer.num_nodes and explorer.engine_num (32), and a worker parses the
run's config before it serves it, so a run of 1,000 nodes or 256 explorers cannot be served any
more. What made those runs unstoppable still can happen within the bounds, and is what these
tests build, on real Celery workers: a trainer's rank 0 waiting for machines that never come, a
node duty holding a train worker, and hundreds of queued duty tasks (sent here as start_run or an
admin's edit of engine_num sent them, without validation)."""
import time

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from apps.runs import duties, holding, services, supervision
from apps.runs.models import Run
from rftweb.celery import enqueue
from tests.support import wait_for
from tests.workers.test_tasks import grpo_config, make_taskset
from workers.rft.config import RunConfig

Status = Run.Status
STOP_WITHIN_S = 30
# Each queued task of a stopped run exits on one database read (~20-60 ms on the shared 2-core box
# under load 10); 1,000 on two workers took 41 s there. Before, every one was claimed and waited.
DRAIN_WITHIN_S = 90


def queued(queue: str) -> int:
    """Tasks waiting in a Celery queue (Redis keeps each queue as a list of that name)."""
    return redis.Redis.from_url(settings.REDIS_URL).llen(queue)


def send_duties(run: Run, wanted) -> None:
    for duty in wanted:
        enqueue(supervision.SERVE_TASK, run.pk, duty, queue="explore" if duties.is_explorer(duty) else "train")


def status_of(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


def stop_and_time(run: Run) -> float:
    """Stop the run as its page does; seconds until it is stopped (fails past STOP_WITHIN_S)."""
    asked = time.monotonic()
    services.stop_run(Run.objects.get(pk=run.pk))
    wait_for(lambda: status_of(run) == Status.STOPPED, timeout=STOP_WITHIN_S, every=0.2,
             what=f"the run to stop (it is {status_of(run)})")
    return time.monotonic() - asked


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_stop_ends_a_trainer_waiting_for_its_machines_and_its_1000_queued_node_duties(
        celery_worker_factory, researcher):
    """A ddp trainer on 32 machines (the most the schema allows) served by two train workers: rank 0
    waits for 31 machines' ranks and one node duty holds the other worker, as in the issue. 1,000
    node duty tasks are queued (the issue's run of 1,000 nodes). Stop ends the run within 30 s and
    every queued task exits at once."""
    make_taskset()
    config = grpo_config(100)
    config["trainer"].update(strategy="ddp", num_processes=1, num_nodes=32, collective_timeout_s=3600)
    run = Run.objects.create(name="32 machines", owner=researcher, config=RunConfig.from_dict(config).to_dict())
    for _ in range(2):
        celery_worker_factory("default,train")
    supervision.start_run(run.pk)  # the trainer's duty and trainer-node-1..31
    send_duties(run, [f"{duties.NODE_DUTY}{k}" for k in range(32, 1001)])
    wait_for(lambda: {"loop", "trainer-node-1"} <= set(duties.workers_holding(Run.objects.get(pk=run.pk))),
             timeout=120, what="rank 0 and a node duty to hold the two workers")
    assert queued("train") > 900
    seconds = stop_and_time(run)
    started = time.monotonic()
    wait_for(lambda: queued("train") == 0, timeout=DRAIN_WITHIN_S, what="the queued node duties to exit")
    print(f"stopped in {seconds:.1f} s; 1,000 queued tasks exited in {time.monotonic() - started:.1f} s more")
    assert Run.objects.get(pk=run.pk).heartbeats.keys() == {"loop", "trainer-node-1"}  # no other was claimed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_stop_ends_a_run_of_256_explorers_and_the_watchdog_never_grows_their_queue(
        celery_worker_factory, researcher, settings):
    """A checkpoint-sync run with one explore worker; an admin's edit (no validation) makes it 256
    explorers, their 254 new duty tasks queued as set_explorers sends them. The watchdog's ticks,
    past the heartbeat timeout, send none of the never-claimed duties again (the issue: 17 -> 510
    -> 765 queued). Stop ends the run within 30 s and the queued explorers exit at once."""
    make_taskset()
    config = RunConfig.from_dict(grpo_config(500, method="checkpoint")).to_dict()
    config["explorer"]["engine_num"] = 2
    run = Run.objects.create(name="explorers", owner=researcher, config=config)
    celery_worker_factory("default,explore")
    celery_worker_factory("train")
    supervision.start_run(run.pk)
    wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 1, timeout=180, what="a trainer step")
    Run.objects.filter(pk=run.pk).update(config={**config, "explorer": {**config["explorer"], "engine_num": 256}})
    send_duties(run, [f"explorer-{k}" for k in range(2, 256)])
    waiting = queued("explore")
    assert waiting == 255  # explorer-1 (the one explore worker serves explorer) and the 254 new ones
    for _ in range(3):  # ticks past the timeout: a duty sent and never claimed looks dead to the old watchdog
        time.sleep(settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)
        assert supervision.watchdog() == []
        assert queued("explore") == waiting
    assert status_of(run) == Status.RUNNING
    seconds = stop_and_time(run)
    wait_for(lambda: queued("explore") == 0, timeout=DRAIN_WITHIN_S, what="the queued explorer duties to exit")
    print(f"stopped in {seconds:.1f} s")


def beat(worker: str, seconds_ago: float = 0) -> dict:
    return {"at": (timezone.now() - timezone.timedelta(seconds=seconds_ago)).isoformat(), "worker": worker}


@pytest.mark.django_db
def test_the_watchdog_counts_but_never_resends_a_duty_nobody_claimed(researcher, settings):
    """Duties never claimed (their task is queued) are not sent; one the watchdog sent on and nobody
    claimed counts a hand-over per timeout without a new task, and fails the run at the limit."""
    settings.RFTWEB_MAX_HANDOVERS = 2
    config = {"mode": "both", "synchronizer": {"method": "checkpoint"}, "explorer": {"engine_num": 256}}
    run = Run.objects.create(name="r", owner=researcher, config=config, status=Status.RUNNING,
                             heartbeats={"explorer": beat("e"), "trainer": beat("t")})
    assert supervision.watchdog() == []  # 254 explorers never claimed: their tasks are queued
    stale = {**beat(duties.HANDED_OVER, seconds_ago=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1),
             "handovers": 1, "handed_over_at_step": 0}
    Run.objects.filter(pk=run.pk).update(heartbeats={**run.heartbeats, "explorer-7": stale})
    assert supervision.watchdog() == []
    run.refresh_from_db()
    assert run.heartbeats["explorer-7"]["handovers"] == 2 and run.status == Status.RUNNING
    Run.objects.filter(pk=run.pk).update(heartbeats={**run.heartbeats, "explorer-7": {
        **run.heartbeats["explorer-7"], "at": stale["at"]}})
    assert supervision.watchdog() == []
    run.refresh_from_db()
    # No explore worker is live: the run says so, and what to start before resuming (resumed as it
    # was, it waited for ever; the message said only "no worker took it over").
    assert run.status == Status.FAILED
    assert "explorer-7 failed: no live worker serves the `explore` queue to take it over" in run.error
    assert "Start one (celery -A rftweb worker -Q explore, docs/scale.md), then resume the run" in run.error


@pytest.mark.django_db
def test_a_stopping_runs_duties_are_not_claimed_and_its_last_duty_to_leave_stops_it(researcher):
    run = Run.objects.create(name="r", owner=researcher, config={}, status=Status.RUNNING,
                             heartbeats={"loop": beat("w1"), "trainer-node-1": beat("w2")})
    services.stop_run(run)
    assert not holding.claim_duty(run, "trainer-node-2", "w3", settings.RFTWEB_HEARTBEAT_TIMEOUT)
    assert holding.release_duty(run, "trainer-node-1", "w2") and status_of(run) == Status.STOPPING
    assert holding.release_duty(run, "loop", "w1") and status_of(run) == Status.STOPPED
