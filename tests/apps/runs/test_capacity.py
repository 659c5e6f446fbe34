"""The Workers page and /api/workers/ (apps/runs/capacity.py): who is live, lost or stopped, and
which run's duty each worker's slots hold. The workers here are rows as a worker writes them
(tests/workers/test_capacity.py starts real ones)."""
import json
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs import capacity, duties, holding, services, waits
from apps.runs.api import token_for
from apps.runs.models import Run, Worker


def worker(name, *, seen_ago=0.0, stopped=False, slots=2):
    now = timezone.now()
    return Worker.objects.create(
        name=name, host="gpu-1", pid=4242, queues=["explore", "train"], slots=slots,
        started_at=now - timedelta(hours=1), last_seen=now - timedelta(seconds=seen_ago),
        stopped_at=now if stopped else None,
    )


def held_by(node: str, since_ago: float = 30.0, beat_ago: float = 0.0) -> dict:
    now = timezone.now()
    return {"at": (now - timedelta(seconds=beat_ago)).isoformat(), "worker": f"gpu-1:{hash(node) % 10000}",
            "node": node, "since": (now - timedelta(seconds=since_ago)).isoformat()}


@pytest.fixture
def busy(make_run):
    """runs@gpu-1 holds the loop of one run and the trainer of another; explore@gpu-2 an explorer;
    a third run's duty beat last long ago (its worker is gone): it is nobody's."""
    worker("runs@gpu-1")
    worker("explore@gpu-2", slots=1)
    worker("old@gpu-3", seen_ago=3600)  # lost an hour ago
    worker("done@gpu-4", seen_ago=600, stopped=True)  # stopped in order
    worker("ancient@gpu-5", seen_ago=3 * 86400)  # lost days ago: not shown
    one = make_run("demo", status=Run.Status.RUNNING, heartbeats={"loop": held_by("runs@gpu-1")})
    two = make_run("two explorers", status=Run.Status.RUNNING, heartbeats={
        "trainer": held_by("runs@gpu-1", since_ago=5), "explorer": held_by("explore@gpu-2"),
    })
    make_run("orphan", status=Run.Status.RUNNING, heartbeats={"loop": held_by("old@gpu-3", beat_ago=3600)})
    make_run("finished", status=Run.Status.COMPLETED, heartbeats={"loop": held_by("runs@gpu-1")})
    return one, two


def test_the_overview_sorts_workers_by_state_with_what_each_slot_holds(busy):
    one, two = busy
    shown = capacity.overview()
    live = {w.name: w for w in shown["workers"]}
    assert list(live) == ["explore@gpu-2", "runs@gpu-1"]
    assert [w.name for w in shown["lost"]] == ["old@gpu-3"] and [w.name for w in shown["stopped"]] == ["done@gpu-4"]
    runs = live["runs@gpu-1"]
    assert [(h.run_id, h.duty) for h in runs.holds] == [(one.pk, "loop"), (two.pk, "trainer")]
    assert runs.state == "live" and runs.slots == 2 and runs.free == 0
    assert [(h.run_name, h.duty) for h in live["explore@gpu-2"].holds] == [("two explorers", "explorer")]
    assert live["explore@gpu-2"].free == 0
    # the orphan's duty is held by no live worker, and a lost worker holds nothing
    assert shown["lost"][0].holds == []


def test_a_worker_of_this_machine_whose_process_is_gone_is_lost_at_once(db):
    """kill -9 of a worker's main process marks no orderly stop, and its last beat stays fresh for
    up to RFTWEB_HEARTBEAT_TIMEOUT: the page showed its slots free for 2 minutes, and launches
    counted on them. A process of this machine is looked at; another machine's beat still tells."""
    import socket

    from apps.runs import hosts

    dead = worker("explore@here")
    Worker.objects.filter(pk=dead.pk).update(host=socket.gethostname(), pid=2**22 + 7,  # no such pid
                                             pid_namespace=duties.pid_namespace())
    worker("explore@elsewhere")
    # A container on the host's network, or a machine of the same name: its pid is not this table's.
    contained = worker("explore@contained")
    Worker.objects.filter(pk=contained.pk).update(host=socket.gethostname(), pid=2**22 + 7,
                                                  pid_namespace="0798d727-e536-4f23-b44e-000000000000/pid:[4026532501]")
    shown = capacity.overview()
    assert [w.name for w in shown["lost"]] == ["explore@here"]
    assert [w.name for w in shown["workers"]] == ["explore@contained", "explore@elsewhere"]
    assert [host.name for host in hosts.serving("explore")] == ["explore@contained", "explore@elsewhere"]
    assert waits.free_slots()["explore"] == {"free": 4, "slots": 4, "workers": 2}


def test_a_duty_of_a_worker_that_never_registered_is_still_shown(make_run):
    make_run("old worker", status=Run.Status.RUNNING, heartbeats={"loop": held_by("legacy@gpu-9")})
    (shown,) = capacity.overview()["workers"]
    assert shown.name == "legacy@gpu-9" and shown.slots is None and [h.duty for h in shown.holds] == ["loop"]


def test_embedded_the_server_process_is_the_one_worker(make_run, settings):
    settings.RFTWEB_EMBEDDED = True
    make_run("demo", status=Run.Status.RUNNING, heartbeats={"loop": held_by(capacity.embedded_name())})
    shown = capacity.overview()
    (me,) = shown["workers"]
    assert me.name == capacity.embedded_name() and me.slots is None and me.free is None
    assert [h.run_name for h in me.holds] == ["demo"] and shown["lost"] == shown["stopped"] == []
    assert capacity.this_node() == capacity.embedded_name()


def test_a_duty_keeps_its_since_and_worker_while_the_same_process_beats(make_run):
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60, node="runs@gpu-1")
    first = Run.objects.get(pk=run.pk).heartbeats["loop"]
    assert holding.heartbeat(run, "loop", "gpu-1:11")
    again = Run.objects.get(pk=run.pk).heartbeats["loop"]
    assert (again["since"], again["node"]) == (first["since"], "runs@gpu-1") and again["at"] >= first["at"]
    # handed to another process (the first is gone): it holds it since now
    run.heartbeats = {"loop": {**again, "ended": True}}
    run.save(update_fields=["heartbeats"])
    assert holding.claim_duty(run, "loop", "gpu-2:22", timeout=60, node="explore@gpu-2")
    taken = Run.objects.get(pk=run.pk).heartbeats["loop"]
    assert taken["node"] == "explore@gpu-2" and taken["since"] > first["since"]


def test_the_page_and_the_api_show_the_same_workers(busy, researcher_client, researcher):
    one, _ = busy
    page = researcher_client.get(reverse("worker-list"))
    assert page.status_code == 200
    embedded_json = page.content.decode().split('id="workers-data" type="application/json">')[1]
    data = json.loads(embedded_json.split("</script>")[0])
    api = researcher_client.get(reverse("api-workers"), HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").json()
    strip = lambda d: {k: [w["name"] for w in v] for k, v in d.items() if k in ("workers", "lost", "stopped")}  # noqa: E731
    assert strip(data) == strip(api) == {
        "workers": ["explore@gpu-2", "runs@gpu-1"], "lost": ["old@gpu-3"], "stopped": ["done@gpu-4"],
    }
    runs = next(w for w in api["workers"] if w["name"] == "runs@gpu-1")
    assert runs["free"] == 0 and runs["queues"] == ["explore", "train"]
    assert runs["holds"][0] | {"since": None, "last_beat": None} == {
        "run_id": one.pk, "run_name": "demo", "run_status": "running", "duty": "loop", "since": None,
        "last_beat": None, "run_url": f"/runs/{one.pk}/",
    }
    assert api["embedded"] is False and "Workers</a>" in page.content.decode()  # in the top bar


def test_the_worker_beat_reports_gpus_it_finds(monkeypatch, db):
    life = worker("runs@gpu-1", seen_ago=30).started_at
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.6, "used_gb": 3.1}
    monkeypatch.setattr(capacity, "gpus", lambda: [h100])
    assert capacity.beat("runs@gpu-1", life, ["explore", "train"], 2) == life
    row = Worker.objects.get(name="runs@gpu-1")
    assert row.gpus[0]["name"] == "NVIDIA H100 80GB HBM3" and timezone.now() - row.last_seen < timedelta(seconds=5)
    assert (row.started_at, row.earlier) == (life, []), "the same life"


def test_a_worker_whose_registration_failed_is_registered_by_its_beat(db):
    """A worker restarted while the database was down (capacity.worker_ready: "its heartbeat will
    register it"): its beats had only moved the row's last_seen, under the killed life's
    started_at, so a job that life had owned was taken as run by the new one (job_owners.is_gone)."""
    from apps.core import job_owners
    from apps.core.models import JobOwner

    killed = worker("jobs@gpu-1")  # an hour ago
    owner = JobOwner(host="gpu-1", pid=4242, process_started=0, worker="jobs@gpu-1",
                     since=killed.started_at + timedelta(minutes=1))

    life = capacity.beat("jobs@gpu-1", None, ["default"], 4)

    row = Worker.objects.get(name="jobs@gpu-1")
    assert row.started_at == life > owner.since and (row.queues, row.slots) == (["default"], 4)
    assert [old["started_at"] for old in row.earlier] == [killed.started_at.isoformat()], "on the page's Lost list"
    assert job_owners.is_gone(owner), "the job's worker restarted since it took the job"
    assert capacity.beat("jobs@gpu-1", life, ["default"], 4) == life, "beats on, the same life"
    assert len(Worker.objects.get(name="jobs@gpu-1").earlier) == 1

    Worker.objects.all().delete()  # a row gone: registered again
    assert capacity.beat("jobs@gpu-1", life, ["default"], 4) > life
    assert Worker.objects.filter(name="jobs@gpu-1").exists()


def test_a_second_live_worker_of_the_same_name_does_not_take_the_row_each_beat(db, caplog):
    """Two live workers named alike (two machines named `ubuntu`, a leftover demo worker): each beat
    re-registered the row as the beating worker's, so each made the other's running jobs look
    orphaned (job_owners.is_gone) and wiped its drain. The row stays the live one's; the other says why."""
    from apps.core import job_owners
    from apps.core.models import JobOwner

    first = capacity.register("jobs@ubuntu", ["default"], 1)
    second = capacity.register("jobs@ubuntu", ["default"], 1)  # its row now
    owner = JobOwner(host="elsewhere", pid=1, process_started=0, pid_namespace="x", worker="jobs@ubuntu",
                     since=timezone.now())
    Worker.objects.filter(name="jobs@ubuntu").update(drain={"default": True})

    assert capacity.beat("jobs@ubuntu", first, ["default"], 1) == first
    row = Worker.objects.get(name="jobs@ubuntu")
    assert (row.started_at, row.drain) == (second, {"default": True})
    assert not job_owners.is_gone(owner)
    assert "Another live worker is named jobs@ubuntu" in caplog.text
    assert capacity.beat("jobs@ubuntu", second, ["default"], 1) == second

    Worker.objects.filter(name="jobs@ubuntu").update(last_seen=timezone.now() - timedelta(hours=1))
    assert capacity.beat("jobs@ubuntu", first, ["default"], 1) > second, "the other one silent: taken"


SPLIT = {"trainer": {"total_steps": 100}, "synchronizer": {"method": "checkpoint"}, "explorer": {"engine_num": 2}}


def started(beat: dict) -> dict:
    return {**beat, "started": beat["since"]}


def test_each_duty_says_where_it_stands_and_what_a_waiting_one_waits_for(busy, make_run):
    """The issue's walk: both train slots busy, a 2-explorer run's trainer waits naming what holds
    them; its first explorer runs, the second waits for an explore slot that none has free."""
    one, two = busy
    run = make_run("wide", status=Run.Status.RUNNING, config=SPLIT,
                   heartbeats={"explorer": started(held_by("explore@gpu-2"))})
    states = {s.duty: s for s in waits.duty_states(run)}
    assert [s.duty for s in states.values()] == ["explorer", "explorer-1", "trainer"]
    assert (states["explorer"].state, states["explorer"].node) == ("running", "explore@gpu-2")
    waiting = states["trainer"]
    assert waiting.state == "waiting" and waiting.queue == "train"
    assert "all 3 slots busy" in waiting.detail  # runs@gpu-1's 2 and explore@gpu-2's 1 (both take train)
    assert f"run {one.pk} demo (loop)" in waiting.detail and f"run {two.pk} two explorers (trainer)" in waiting.detail
    assert states["explorer-1"].state == "waiting" and "`explore` worker" in states["explorer-1"].detail
    assert waits.shown_status(run) == "queued"  # not "running" until every duty started
    answer = waits.duties_json(run)
    assert (answer["explorers"], answer["explorers_running"], answer["shown_status"]) == (2, 1, "queued")
    # Once its trainer holds too, it trains: the second explorer only adds speed when it comes
    # (checkpoint sync; it read "queued" at trainer step 12). With nccl the group needs both.
    run.heartbeats["trainer"] = started(held_by("runs@gpu-1"))
    assert waits.shown_status(run) == "running"
    run.config = {**SPLIT, "synchronizer": {"method": "nccl"}}
    assert waits.shown_status(run) == "queued"


def test_starting_lost_handed_over_and_ended_duties(make_run):
    worker("train@gpu-1")
    gone = worker("explore@gpu-2", stopped=True)
    run = make_run("states", status=Run.Status.RUNNING, config={**SPLIT, "explorer": {"engine_num": 4}}, heartbeats={
        "trainer": held_by("train@gpu-1"),  # claimed, not started: loading the model
        "explorer": started(held_by("explore@gpu-2")),  # its worker stopped (SIGTERM): lost at once
        "explorer-1": {**started(held_by("train@gpu-1", beat_ago=600))},  # silent for 10 minutes
        "explorer-2": {"at": timezone.now().isoformat(), "worker": duties.HANDED_OVER, "handovers": 2},
        # let go by a worker that shut down in order (SIGTERM), the run still active: sent on
        "explorer-3": {**started(held_by("train@gpu-1")), "ended": timezone.now().isoformat(),
                       "handed_back": "its worker train@gpu-1 is shutting down"},
    })
    states = {s.duty: s for s in waits.duty_states(run)}
    assert {duty: s.state for duty, s in states.items()} == {
        "trainer": "starting", "explorer": "handing back", "explorer-1": "lost", "explorer-2": "handed over",
        "explorer-3": "handed over",
    }
    # Its worker stopped in order and the duty still beats: it hands the run back (it said "lost").
    assert f"its worker {gone.name} is shutting down in order" in states["explorer"].detail
    assert "fell silent 600 s ago" in states["explorer-1"].detail
    assert "sent on 2 times with no step done; the run fails after " in states["explorer-2"].detail
    assert "is shutting down" in states["explorer-3"].detail and "`explore` worker" in states["explorer-3"].detail
    assert waits.shown_status(run) == "waiting"  # every duty was taken once; some wait to be taken again
    run.status = Run.Status.COMPLETED
    ended = {s.duty: s.state for s in waits.duty_states(run)}["explorer-3"]
    assert ended == "ended" and waits.shown_status(run) == "completed"


def test_started_is_stamped_when_the_engine_runs_and_kept_while_the_worker_beats(make_run):
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60, node="runs@gpu-1")
    run.refresh_from_db()
    assert [s.state for s in waits.duty_states(run)] == ["starting"]
    holding.mark_started(run, "loop", "gpu-1:11")
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and [s.state for s in waits.duty_states(run)] == ["running"]
    stamp = run.heartbeats["loop"]["started"]
    assert holding.heartbeat(run, "loop", "gpu-1:11")
    assert Run.objects.get(pk=run.pk).heartbeats["loop"]["started"] == stamp
    holding.mark_started(run, "loop", "someone-else:1")  # not its holder: nothing changes
    assert Run.objects.get(pk=run.pk).heartbeats["loop"]["started"] == stamp


def test_a_duty_waiting_with_no_worker_on_its_queue_says_how_to_add_one(make_run):
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    (state,) = waits.duty_states(run)
    assert state.state == "waiting" and "none is live" in state.detail
    assert "celery -A rftweb worker -Q train" in state.detail


def test_launch_warnings_follow_the_free_slots(busy, settings):
    # runs@gpu-1 (2 slots, both busy) and explore@gpu-2 (1 slot, busy) take both queues
    one, two = busy
    (train,) = waits.launch_warnings({})  # a loop run: one train slot, none free
    assert "needs 1 `train` slot(s) and 0 are free" in train and "celery -A rftweb worker -Q train" in train
    assert waits.launch_warnings({}, run_id=two.pk) == []  # what the run itself took counts as free
    worker("more@gpu-6", slots=4)  # 4 free slots on both queues
    assert waits.launch_warnings(SPLIT) == []
    nccl = {**SPLIT, "synchronizer": {"method": "nccl"}, "explorer": {"engine_num": 6}}
    (explore,) = waits.launch_warnings(nccl)
    assert "nccl sends the weights to all 6 explorers" in explore and "4 `explore` slot(s) are free" in explore
    checkpoint = {**SPLIT, "explorer": {"engine_num": 6}}
    (starts_with,) = waits.launch_warnings(checkpoint)
    assert "the run starts with 4" in starts_with
    settings.RFTWEB_EMBEDDED = True
    assert waits.launch_warnings(nccl) == []  # embedded: threads of the server, no slots


def test_the_run_page_and_the_api_show_the_duties(busy, make_run, researcher_client, researcher):
    run = make_run("wide", status=Run.Status.RUNNING, config=SPLIT,
                   heartbeats={"explorer": started(held_by("explore@gpu-2"))})
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    data = json.loads(page.split('id="run-page-data" type="application/json">')[1].split("</script>")[0])
    assert [d["state"] for d in data["duties"]["duties"]] == ["running", "waiting", "waiting"]
    api = researcher_client.get(reverse("api-run-duties", args=[run.pk]),
                                HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").json()
    assert api["duties"] == data["duties"]["duties"] and api["shown_status"] == "queued"
    listed = researcher_client.get(reverse("run-list")).content.decode()
    assert '<span class="status queued"' in listed


def test_a_stopping_or_stopped_run_waits_for_no_worker(make_run):
    """Issue #42, finding 4: right after Stop, a stopped run's explorer line said "handed over ...
    waiting for an `explore` worker: one has a free slot and takes it next", and its trainer
    "running", for about two minutes."""
    worker("train@gpu-1")
    beats = {
        "trainer": started(held_by("train@gpu-1")),
        "explorer": {**started(held_by("train@gpu-1")), "ended": timezone.now().isoformat(),
                     "handed_back": "its worker train@gpu-1 is shutting down"},
    }
    run = make_run("stopping", status=Run.Status.STOPPING, config=SPLIT, heartbeats=beats)
    states = {s.duty: s for s in waits.duty_states(run)}
    assert {duty: s.state for duty, s in states.items()} == {  # explorer-1 was never taken: nor will it be
        "trainer": "stopping", "explorer": "ended", "explorer-1": "ended"}
    assert "saves what a resume needs" in states["trainer"].detail
    assert states["explorer"].detail == states["explorer-1"].detail == "the run is stopping"
    run.status = Run.Status.STOPPED
    assert {s.duty: (s.state, s.detail) for s in waits.duty_states(run)} == dict.fromkeys(
        ["trainer", "explorer", "explorer-1"], ("ended", "the run stopped"))


def test_the_run_page_says_queued_as_the_list_does_until_a_worker_takes_it(researcher_client, make_run):
    """Issue #42, finding 8: the run page said "starting" where the runs list said "queued"."""
    run = make_run("waits", status=Run.Status.STARTING, heartbeats={})
    html = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'id="run-status" data-status="starting">queued</span>' in html


def test_a_duty_waiting_for_workers_the_demo_is_starting_says_so(make_run):
    """Issue #42, finding 5: in the full stack's first minute the page said "none is live. Start
    one ..." while `make demo` was still starting its own workers."""
    run = make_run("early", status=Run.Status.STARTING, heartbeats={})
    capacity.workers_starting({"train": ["train@here"]})
    try:
        (state,) = waits.duty_states(run)
        assert state.detail == "waiting for a `train` worker: train@here is starting on this machine"
    finally:
        capacity.shared_cache.delete(capacity.STARTING_KEY)
    (state,) = waits.duty_states(run)
    assert "none is live" in state.detail


def test_a_duty_that_went_on_from_a_checkpoint_says_so(make_run):
    """Issue #42, finding 6: a run restarted from a checkpoint said so only on the worker's console."""
    worker("train@gpu-1")
    run = make_run("restarted", status=Run.Status.RUNNING, heartbeats={
        "loop": {**started(held_by("train@gpu-1")), "from_checkpoint": {"version": 285, "step": 285}}})
    (state,) = waits.duty_states(run)
    assert state.state == "running" and state.detail == "on train@gpu-1, from checkpoint v285 (trainer step 285)"


def test_a_running_duty_says_what_its_engine_does_and_how_long_a_long_phase_has_taken(make_run):
    """#42, finding 11: the duty line said only "running on X". The heartbeat writes what the
    engine does now (workers/rft/activity.py); a phase past DOING_LONG_S says how long."""
    import time

    worker("runs@gpu-1")
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60, node="runs@gpu-1")
    holding.mark_started(run, "loop", "gpu-1:11")
    doing = [{"role": "explorer", "what": "rolling out step 13 with v12", "since": time.time() - 2},
             {"role": "trainer", "what": "saving a checkpoint at step 12", "since": time.time() - 45}]
    assert holding.heartbeat(run, "loop", "gpu-1:11", doing)
    (state,) = waits.duty_states(Run.objects.get(pk=run.pk))
    assert state.state == "running"
    assert state.detail == "rolling out step 13 with v12 · saving a checkpoint at step 12 (45 s) · on runs@gpu-1"
    # The parts and the rest apart: the run page shows newer parts its live channel brings (run_duties.js).
    assert (state.doing, state.where) == (doing, "on runs@gpu-1")
    assert holding.heartbeat(run, "loop", "gpu-1:11")  # a beat with nothing new keeps what it said
    assert Run.objects.get(pk=run.pk).heartbeats["loop"]["doing"] == doing


def test_a_late_beat_says_how_old_its_news_is_and_a_paused_run_says_paused(make_run, settings):
    """A walkthrough: "rolling out step 188" stood beside trainer step 233 (a loaded machine's late
    beats), and a paused run's duty still said "running · rolling out step 113"."""
    import time

    worker("runs@gpu-1")
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60, node="runs@gpu-1")
    holding.mark_started(run, "loop", "gpu-1:11")
    assert holding.heartbeat(run, "loop", "gpu-1:11", [{"role": "explorer", "what": "rolling out step 188",
                                                         "since": time.time()}])
    late = settings.RFTWEB_HEARTBEAT_INTERVAL * 2
    beats = Run.objects.get(pk=run.pk).heartbeats
    beats["loop"]["at"] = (timezone.now() - timedelta(seconds=late)).isoformat()
    Run.objects.filter(pk=run.pk).update(heartbeats=beats, status=Run.Status.RUNNING)
    (state,) = waits.duty_states(Run.objects.get(pk=run.pk))
    assert state.detail == f"rolling out step 188 (as of {late:.0f} s ago) · on runs@gpu-1"
    Run.objects.filter(pk=run.pk).update(status=Run.Status.PAUSED)
    (state,) = waits.duty_states(Run.objects.get(pk=run.pk))
    assert (state.state, state.detail) == ("paused", "its steps wait for Resume · on runs@gpu-1")
    answer = waits.duties_json(Run.objects.get(pk=run.pk))
    assert answer["shown_status"] == "paused" and answer["duties"][0]["state"] == "paused"


def test_a_curator_hands_a_held_duty_back_and_others_may_not(make_run, client, curator, researcher):
    """The Workers page's duty actions (views.worker_duty; the journey: tests/journeys/
    test_workers_actions.py): a hand-back asked is on the duty's beat, its line says so, and a
    heartbeat of the same holder keeps it; a new holding does not inherit it."""
    worker("runs@gpu-1")
    run = make_run("r", status=Run.Status.STARTING, heartbeats={})
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60, node="runs@gpu-1")
    holding.mark_started(run, "loop", "gpu-1:11")
    url = lambda action, duty="loop": reverse("worker-duty", args=[run.pk, duty, action])  # noqa: E731
    client.force_login(researcher)
    assert client.post(url("hand-back")).status_code == 403
    assert "data-act" not in client.get(reverse("worker-list")).content.decode()
    client.force_login(curator)
    assert 'data-act="/workers/runs/"' in client.get(reverse("worker-list")).content.decode()
    assert client.post(url("fly")).status_code == 404 and client.post(url("hand-back", "trainer")).status_code == 404
    assert client.post(url("hand-back")).status_code == 302
    beat = Run.objects.get(pk=run.pk).heartbeats["loop"]
    assert beat["hand_back"]["by"] == "cur"
    (state,) = waits.duty_states(Run.objects.get(pk=run.pk))
    assert state.state == "handing back" and "cur handed it back" in state.detail
    assert holding.heartbeat(run, "loop", "gpu-1:11")
    assert "hand_back" in Run.objects.get(pk=run.pk).heartbeats["loop"]
    holding.release_duty(run, "loop", "gpu-1:11", handed_back="cur handed it back to its queue")
    messages = [m.message for m in client.post(url("hand-back"), follow=True).context["messages"]]
    assert messages[-1] == f"no live worker holds the loop duty of run {run.name!r}"
    assert holding.claim_duty(run, "loop", "gpu-1:11", timeout=60)  # the same process takes it again
    assert "hand_back" not in Run.objects.get(pk=run.pk).heartbeats["loop"]


@pytest.mark.parametrize("method, refused", [("nccl", True), ("checkpoint", False)])
def test_an_nccl_explorer_is_not_handed_back(make_run, method, refused):
    """Its weight group has a fixed size (set_explorers refuses to change it for the same reason):
    handed back, an explorer broke it, and the trainer restarted from its checkpoint after
    synchronizer.timeout_s, the run's page reading as normal waiting all along."""
    worker("explore@gpu-2")
    run = make_run("split", status=Run.Status.RUNNING, config={"synchronizer": {"method": method}},
                   heartbeats={"explorer": held_by("explore@gpu-2")})
    if refused:
        with pytest.raises(services.InvalidTransition, match="nccl weight group, of a fixed size"):
            holding.hand_back(run, "explorer", "cur")
        assert "hand_back" not in Run.objects.get(pk=run.pk).heartbeats["explorer"]
    else:
        holding.hand_back(run, "explorer", "cur")
        assert Run.objects.get(pk=run.pk).heartbeats["explorer"]["hand_back"]["by"] == "cur"


def test_the_worker_beat_reports_what_its_processes_use(db):
    """Flower shows each worker's load and memory: the beat measures the worker's process and its
    children (its pool), and the page and the API show it under what the worker may use."""
    import threading

    from apps.runs import hosts

    life = worker("train@gpu-1").started_at
    usage = hosts.ProcessUsage()
    assert usage()["cpu_percent"] is None  # nothing to compare with yet
    stop = time.monotonic() + 0.3
    while time.monotonic() < stop:  # busy: this process uses about one core
        pass
    measured = usage()
    assert measured["rss_gb"] > 0.01 and 5 <= measured["cpu_percent"] <= 100 * (threading.active_count() + 1)
    capacity.beat("train@gpu-1", life, ["explore", "train"], 2, measured)
    (shown,) = capacity.overview()["workers"]
    assert shown.usage == measured and shown.as_json()["usage"] == measured
