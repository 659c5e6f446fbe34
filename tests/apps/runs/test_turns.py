"""Who gets a free slot (apps/runs/turns.py): the duty of its queue that first asked for one,
whatever task a worker took from the broker; a hand-over or a hand-back keeps the duty's place.
Issue #42, finding 3: after a full-stack restart the demo run waited behind two runs launched
after it, because its duty was sent again last. tests/journeys/test_recovery.py does it with real
workers."""
from datetime import timedelta
from uuid import uuid4

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs import capacity, holding, supervision, task_log, turns, waits
from apps.runs.models import Run, TaskRun, Worker

RUNNING = Run.Status.RUNNING


def ago(minutes: float) -> str:
    return (timezone.now() - timedelta(minutes=minutes)).isoformat()


def entry(asked: str, queue: str = "train") -> dict:
    return {"task": str(uuid4()), "queue": queue, "at": timezone.now().isoformat(), "asked": asked}


@pytest.fixture
def two_waiting(make_run):
    """The demo run, handed back by its worker's restart 10 minutes after it first asked, and a
    run launched 1 minute ago: both wait for a `train` slot."""
    handed_back = {"at": ago(1), "worker": "gpu-1:7", "node": "train@gpu-1", "ended": ago(1), "asked": ago(10),
                   "handed_back": "its worker train@gpu-1 is shutting down"}
    demo = make_run("demo", status=RUNNING, heartbeats={"loop": handed_back},
                    queued_tasks={"loop": entry(handed_back["asked"])})
    later = make_run("later", status=RUNNING, heartbeats={}, queued_tasks={"loop": entry(ago(1))})
    return demo, later


def task_of(run: Run, duty: str = "loop") -> str:
    return Run.objects.get(pk=run.pk).queued_tasks[duty]["task"]


def test_the_task_a_worker_takes_serves_the_duty_that_asked_first_and_the_two_swap_tasks(two_waiting):
    demo, later = two_waiting
    demo_task, later_task, asked = task_of(demo), task_of(later), demo.queued_tasks["loop"]["asked"]
    # The broker hands out the later run's task first (it was sent before the demo's hand-back).
    task_log.started(later_task, "workers.tasks.serve_duty", [later.pk, "loop"])  # as task_prerun writes it
    assert turns.turn(later.pk, "loop", later_task) == (demo.pk, "loop")
    # The Workers page's task list names the duty it serves, not the message's (a kill of it read as
    # the other run's).
    assert TaskRun.objects.get(task_id=later_task).args == repr([demo.pk, "loop"])
    assert (task_of(demo), task_of(later)) == (later_task, demo_task)  # each still has one task queued
    assert holding.claim_duty(demo, "loop", "gpu-2:9", timeout=60, node="train@gpu-2", task=later_task)
    demo.refresh_from_db()
    assert demo.queued_tasks == {} and demo.heartbeats["loop"]["asked"] == asked  # kept for its next hand-over
    # The demo's own task, when a worker takes it, now stands for the later run.
    assert turns.turn(demo.pk, "loop", demo_task) == (later.pk, "loop")
    assert turns.owner_of(demo_task, demo.pk, "loop") == (later.pk, "loop")  # what worker_lost reads
    # A task no waiting duty counts (a stale one) serves what it was sent for: claim_duty decides.
    stale = str(uuid4())
    assert turns.turn(later.pk, "loop", stale) == (later.pk, "loop")
    assert task_of(later) == demo_task


def test_a_duty_keeps_its_place_through_a_hand_over_and_a_resume_asks_afresh(make_run, settings):
    first_asked = ago(30)
    run = make_run("kept", status=RUNNING, heartbeats={"loop": {
        "at": ago(5), "worker": "gpu-1:7", "node": "train@gpu-1", "asked": first_asked}})  # silent 5 minutes
    assert holding.hand_over(run, "loop", limit=3)  # the watchdog sends it on
    run.refresh_from_db()
    assert run.heartbeats["loop"]["asked"] == first_asked
    assert supervision.send(run, ["loop"]) == ["loop"]
    assert Run.objects.get(pk=run.pk).queued_tasks["loop"]["asked"] == first_asked
    fresh = make_run("fresh", status=Run.Status.STARTING, heartbeats={})  # a launch, or a resume (heartbeats {})
    supervision.send(fresh, ["loop"])
    asked = Run.objects.get(pk=fresh.pk).queued_tasks["loop"]["asked"]
    assert timezone.now() - timezone.datetime.fromisoformat(asked) < timedelta(minutes=1)


def test_queues_are_in_the_order_duties_first_asked_and_a_split_runs_duties_in_theirs(make_run):
    split = {"synchronizer": {"method": "checkpoint"}, "explorer": {"engine_num": 2}}
    same = ago(3)
    wide = make_run("wide", status=RUNNING, config=split, heartbeats={}, queued_tasks={
        "trainer": entry(same), "explorer-1": entry(same, "explore"), "explorer": entry(same, "explore")})
    early = make_run("early", status=RUNNING, heartbeats={}, queued_tasks={"loop": entry(ago(20))})
    make_run("stopping", status=Run.Status.STOPPING, heartbeats={}, queued_tasks={"loop": entry(ago(60))})
    waiting = turns.queues()
    assert [(w.run_id, w.duty) for w in waiting["train"]] == [(early.pk, "loop"), (wide.pk, "trainer")]
    assert [w.duty for w in waiting["explore"]] == ["explorer", "explorer-1"]
    assert {w.why for w in waiting["train"]} == {"new"}


def test_a_waiting_duty_says_how_many_go_before_it_and_the_workers_page_shows_each_queue(
        two_waiting, make_run, researcher_client):
    demo, later = two_waiting
    now = timezone.now()
    Worker.objects.create(name="train@gpu-1", host="gpu-1", pid=1, queues=["train"], slots=1, started_at=now,
                          last_seen=now)
    make_run("holder", status=RUNNING, heartbeats={"loop": {
        "at": now.isoformat(), "worker": "gpu-1:3", "node": "train@gpu-1", "since": now.isoformat()}})
    (state,) = waits.duty_states(Run.objects.get(pk=later.pk))
    assert state.state == "waiting" and "1 duty asked before it and goes first" in state.detail, state.detail
    (state,) = waits.duty_states(Run.objects.get(pk=demo.pk))
    assert state.state == "handed over" and "it is next" in state.detail, state.detail

    data = researcher_client.get(reverse("api-workers")).json()
    assert [(w["run_id"], w["why"]) for w in data["waiting"]["train"]] == [(demo.pk, "handed back"),
                                                                          (later.pk, "new")]
    page = researcher_client.get(reverse("worker-list")).content.decode()
    assert "Waiting for a slot" in page and "handed back" in page  # the page's own copy of the JSON


def test_a_leftover_worker_of_the_same_name_stopping_leaves_the_live_one_serving(db):
    """A demo killed whole left its Celery workers running; started again, it ran new ones of the
    same names. The leftover's orderly stop marked the shared row stopped, and the live worker then
    handed back every duty it took (node_stopping), every 2.5 s."""
    old_life = capacity.register("train@vm", ["train"], 2)
    capacity.register("train@vm", ["train"], 2)  # the new demo's worker
    capacity.stopped("train@vm", old_life)  # the leftover stops in order
    assert not capacity.node_stopping("train@vm")


def test_a_worker_restarted_under_its_name_keeps_its_stopped_and_lost_lives_on_the_page(db, monkeypatch):
    """The Stopped list lost every worker restarted since (a restart reused its row)."""
    life = capacity.register("train@vm", ["train"], 2)
    capacity.stopped("train@vm", life)  # stopped in order (SIGTERM) ...
    capacity.register("train@vm", ["train"], 2)  # ... and started again
    Worker.objects.filter(name="train@vm").update(last_seen=timezone.now() - timedelta(hours=1))  # then lost
    capacity.register("train@vm", ["train"], 2)  # and started again
    shown = capacity.overview()
    assert [w.name for w in shown["workers"]] == ["train@vm"]
    (stopped,) = shown["stopped"]
    (lost,) = shown["lost"]
    assert stopped.stopped_at is not None and stopped.restarted_at is not None
    assert lost.restarted_at == Worker.objects.get(name="train@vm").started_at
    assert stopped.restarted_at < lost.restarted_at
    two_days_ago = (timezone.now() - timedelta(days=2)).isoformat()
    Worker.objects.filter(name="train@vm").update(earlier=[{
        **Worker.objects.get(name="train@vm").earlier[0], "last_seen": two_days_ago}])
    assert len(capacity.overview()["stopped"]) + len(capacity.overview()["lost"]) == 0  # older than a day


def test_a_duty_a_task_turned_to_is_taken_until_claimed_and_the_next_task_serves_the_next_duty(make_run):
    """Two workers take a 2-explorer run's two tasks at once: each serves one explorer. The second
    turn had also picked the first explorer (not claimed yet), and swapped the other explorer onto
    the task already taken: that explorer never got a worker."""
    split = {"synchronizer": {"method": "checkpoint"}, "explorer": {"engine_num": 2}}
    same = ago(1)
    run = make_run("wide", status=RUNNING, config=split, heartbeats={}, queued_tasks={
        "explorer": entry(same, "explore"), "explorer-1": entry(same, "explore"), "trainer": entry(same)})
    first_task, second_task = task_of(run, "explorer"), task_of(run, "explorer-1")
    # The second explorer's task is taken first, then the first's, before either claims.
    assert turns.turn(run.pk, "explorer-1", second_task) == (run.pk, "explorer")
    assert turns.turn(run.pk, "explorer", first_task) == (run.pk, "explorer-1")
    assert [w.duty for w in turns.queues()["train"]] == ["trainer"] and "explore" not in turns.queues()
    for duty, task in (("explorer", second_task), ("explorer-1", first_task)):
        assert holding.claim_duty(run, duty, f"gpu-1:{task[:4]}", timeout=60, task=task)
    assert set(Run.objects.get(pk=run.pk).queued_tasks) == {"trainer"}


def test_a_duty_turned_to_but_never_claimed_is_sent_again_by_the_watchdog(two_waiting, settings):
    """The machine of the worker that took the task died between the turn and the claim: after the
    heartbeat timeout the watchdog sends the duty again (it had waited for Celery's visibility
    timeout, six hours)."""
    demo, later = two_waiting
    task = task_of(later)
    assert turns.turn(later.pk, "loop", task) == (demo.pk, "loop")
    entry_ = Run.objects.get(pk=demo.pk).queued_tasks["loop"]
    assert entry_["task"] == task and entry_["taken"]
    supervision.watchdog()
    assert Run.objects.get(pk=demo.pk).queued_tasks["loop"] == entry_  # within the timeout: left alone
    old = (timezone.now() - timedelta(seconds=settings.RFTWEB_HEARTBEAT_TIMEOUT + 1)).isoformat()
    Run.objects.filter(pk=demo.pk).update(queued_tasks={"loop": {**entry_, "taken": old}})
    assert (demo.pk, "loop") in supervision.watchdog()
    again = Run.objects.get(pk=demo.pk).queued_tasks["loop"]
    assert again["task"] != task and "taken" not in again and again["asked"] == entry_["asked"]  # its place kept
