"""One worker's page (/workers/<name>/) and /api/workers/<name>/ (apps/runs/worker_detail.py): what
it holds now, the duties it held in the last day and how each ended (from the serve_duty tasks it
ran and the runs' duty heartbeats), its log's tail, and the links to it from the Workers page and
a run's duty lines. Workers are rows as a worker writes them (tests/workers/test_capacity.py starts
real ones); the history's rows are task_log's, written by its own functions."""
import json
import logging
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs import capacity, logs, task_log, waits, worker_detail
from apps.runs.api import token_for
from apps.runs.logs import DutyLog
from apps.runs.models import Run, TaskRun, Worker
from apps.runs.supervision import SERVE_TASK, run_dir

ODD = 'runs@gpu 1/ü?#%<b>"'  # what `celery worker -n` takes: quoted in every link, escaped on the page
log = logging.getLogger("workers.rft.loop")


def worker(name, *, seen_ago=0.0, stopped=False, started_ago=3600.0):
    now = timezone.now()
    return Worker.objects.create(
        name=name, host="gpu-1", pid=4242, queues=["train"], slots=2, started_at=now - timedelta(seconds=started_ago),
        last_seen=now - timedelta(seconds=seen_ago), stopped_at=now if stopped else None)


def beat(node: str, **extra) -> dict:
    now = timezone.now()
    return {"at": now.isoformat(), "worker": "gpu-1:77", "node": node,
            "since": (now - timedelta(seconds=60)).isoformat(), "started": (now - timedelta(seconds=50)).isoformat(),
            **extra}


def ran(task_id: str, node: str, run: Run, duty: str, *, ago: float, result: str | None = None,
        outcome: str = "success") -> None:
    """A serve_duty task `node` ran `ago` seconds ago, ended with `result` (None: still running)."""
    TaskRun.objects.create(task_id=task_id, name=SERVE_TASK, args=repr([run.pk, duty]), worker=node,
                           started_at=timezone.now() - timedelta(seconds=ago), outcome="running")
    if result is not None or outcome != "success":
        task_log.ended(task_id, outcome, result)


@pytest.fixture
def history(make_run, settings, tmp_path):
    """`ODD` holds the loop of `now` and held duties of four runs before; another worker held one too."""
    settings.DATA_DIR = tmp_path
    worker(ODD)
    worker("other@gpu-2")
    now = make_run("now", status=Run.Status.RUNNING, heartbeats={"loop": beat(ODD, task="t-now")},
                   trainer_step=7)
    done = make_run("done", status=Run.Status.COMPLETED)
    back = make_run("back", status=Run.Status.RUNNING, heartbeats={"trainer": beat("other@gpu-2")},
                    config={"trainer": {"total_steps": 10}, "synchronizer": {"method": "checkpoint"}})
    killed = make_run("killed", status=Run.Status.FAILED)
    ran("t-done", ODD, done, "loop", ago=900, result="completed")
    ran("t-back", ODD, back, "trainer", ago=800, result="handed back")
    ran("t-killed", ODD, killed, "loop", ago=700, outcome="lost")
    ran("t-skip", ODD, done, "loop", ago=650, result="skipped")  # held nothing: not shown
    ran("t-dead", ODD, killed, "loop", ago=5000)  # running before this life started: its worker died under it
    ran("t-now", ODD, now, "loop", ago=60)
    ran("t-theirs", "other@gpu-2", back, "trainer", ago=100)
    with DutyLog(run_dir(now), now.pk, "loop"):
        log.info("trainer step 7 of run now")
    return {"now": now, "done": done, "back": back, "killed": killed}


def test_a_worker_shows_what_it_holds_and_how_each_duty_it_held_ended(history):
    shown = worker_detail.detail(ODD)
    assert shown["worker"]["name"] == ODD and shown["worker"]["state"] == "live"
    assert 0 <= shown["heartbeat_age_s"] < 5
    (hold,) = shown["holds"]
    assert (hold["run_name"], hold["duty"], hold["state"], hold["trainer_step"], hold["total_steps"]) == (
        "now", "loop", "running", 7, 100)
    assert [(one["run_name"], one["duty"], one["how"]) for one in shown["history"]] == [
        ("now", "loop", "holding"), ("killed", "loop", "lost"), ("back", "trainer", "handed back"),
        ("done", "loop", "completed"), ("killed", "loop", "lost"),
    ]
    assert shown["history"][0]["ended_at"] is None and shown["history"][3]["ended_at"] is not None
    (line,) = shown["logs"]
    assert (line["message"], line["run_name"], line["duty"]) == ("trainer step 7 of run now", "now", "loop")


def test_a_duty_no_task_row_names_comes_from_its_heartbeat(make_run, settings):
    """The embedded server runs no Celery task: its duties' heartbeats name it, and say how each ended."""
    settings.RFTWEB_EMBEDDED = True
    me = capacity.embedded_name()
    make_run("live", status=Run.Status.RUNNING, heartbeats={"loop": beat(me)})
    make_run("finished", status=Run.Status.COMPLETED, heartbeats={"loop": beat(me, ended=timezone.now().isoformat())})
    make_run("handed", status=Run.Status.RUNNING, heartbeats={
        "loop": beat(me, ended=timezone.now().isoformat(), handed_back="the server is shutting down")})
    make_run("elsewhere", status=Run.Status.COMPLETED, heartbeats={"loop": beat("someone@else")})
    shown = worker_detail.detail(me)
    assert sorted((one["run_name"], one["how"]) for one in shown["history"]) == [
        ("finished", "completed"), ("handed", "handed back"), ("live", "holding")]
    assert shown["heartbeat_age_s"] is None and [h["run_name"] for h in shown["holds"]] == ["live"]


def test_lines_other_workers_logged_for_the_same_duty_are_not_its_own(make_run, settings, tmp_path):
    """A duty's log file is the duty's, whoever served it: the page shows the lines of its holding only."""
    settings.DATA_DIR = tmp_path
    worker(ODD)
    run = make_run("shared", status=Run.Status.RUNNING, heartbeats={"loop": beat(ODD, task="t-mine")})
    with DutyLog(run_dir(run), run.pk, "loop"):
        log.info("the worker before it")
    # The earlier worker's line, an hour old, as the file keeps it.
    path = logs.log_dir(run_dir(run)) / "loop.jsonl"
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    lines[0]["time"] -= 3600
    path.write_text(json.dumps(lines[0]) + "\n")
    ran("t-mine", ODD, run, "loop", ago=30)
    with DutyLog(run_dir(run), run.pk, "loop"):
        log.info("its own line")
    assert [line["message"] for line in worker_detail.detail(ODD)["logs"]] == ["its own line"]


def test_a_log_tail_reads_the_end_of_a_long_file_only(tmp_path):
    directory = logs.log_dir(tmp_path)
    directory.mkdir(parents=True)
    rows = [{"time": 1000 + i, "level": "INFO", "duty": "loop", "message": f"line {i} " + "x" * 200}
            for i in range(1000)]  # ~220 KB: more than a tail reads
    (directory / "loop.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    found = logs.tail(tmp_path, "loop", since=0, until=None, limit=10_000)
    assert 0 < len(found) < 1000 and found[-1]["message"].startswith("line 999 ")
    assert all(line["message"].endswith("x") for line in found)  # none cut by the seek
    assert [line["time"] for line in logs.tail(tmp_path, "loop", since=1990, until=1995, limit=3)] == [1993, 1994, 1995]
    assert logs.tail(tmp_path, "explorer", since=0, until=None, limit=5) == []


def test_the_page_and_the_api_answer_the_same_and_quote_an_odd_name(history, researcher_client, researcher):
    url = reverse("worker-detail", args=[ODD])
    assert url == "/workers/runs@gpu%201/%C3%BC%3F%23%25%3Cb%3E%22/"
    page = researcher_client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert "<b>" not in text.split('id="worker-data"')[0]  # the name is escaped, never markup
    data = json.loads(text.split('id="worker-data" type="application/json">')[1].split("</script>")[0])
    api = researcher_client.get(reverse("api-worker", args=[ODD]),
                                HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").json()
    assert data["worker"]["name"] == api["worker"]["name"] == ODD
    assert [one["how"] for one in data["history"]] == [one["how"] for one in api["history"]]
    assert api["holds"][0]["detail"] and api["worker"]["url"] == url


def test_an_unknown_worker_is_a_404_that_names_it(researcher_client, researcher, db):
    worker("ancient@gpu-5", seen_ago=3 * 86400)  # not seen in the last day
    for name in ("nobody@nowhere", "ancient@gpu-5"):
        assert researcher_client.get(reverse("worker-detail", args=[name])).status_code == 404
        answer = researcher_client.get(reverse("api-worker", args=[name]),
                                       HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
        assert answer.status_code == 404 and name in answer.json()["error"]
    pasted = "w" * 5000  # a name is quoted back cut, not whole
    answer = researcher_client.get(reverse("api-worker", args=[pasted]),
                                   HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    assert answer.status_code == 404 and len(answer.json()["error"]) < 200
    assert f"'{'w' * 100}'…" in answer.json()["error"]


def test_the_workers_page_and_a_runs_duties_link_the_worker(history, researcher_client):
    data = researcher_client.get(reverse("api-workers")).json()
    assert {w["name"]: w["url"] for w in data["workers"]}[ODD] == reverse("worker-detail", args=[ODD])
    (loop,) = waits.duties_json(history["now"])["duties"]
    assert loop["node"] == ODD and loop["node_url"] == reverse("worker-detail", args=[ODD])
    api = researcher_client.get(reverse("api-run-duties", args=[history["now"].pk])).json()
    assert api["duties"][0]["node_url"] == loop["node_url"]


def test_a_curators_action_from_a_worker_page_comes_back_to_it(history, client, curator):
    client.force_login(curator)
    page = reverse("worker-detail", args=[ODD])
    action = reverse("worker-duty", args=[history["now"].pk, "loop", "hand-back"])
    response = client.post(action, {"next": page})
    assert response.status_code == 302 and response["Location"] == page
    assert Run.objects.get(pk=history["now"].pk).heartbeats["loop"]["hand_back"]["by"] == curator.username
    for elsewhere in ("https://evil.example/workers/", "//evil.example/workers/", "/runs/"):
        response = client.post(reverse("worker-duty", args=[history["now"].pk, "loop", "stop"]), {"next": elsewhere})
        assert response["Location"] == reverse("worker-list")


def test_a_worker_that_never_registered_has_a_page_of_what_it_holds(make_run):
    """Started before workers registered (capacity.overview still shows what it holds): no heartbeat of its own."""
    make_run("old worker", status=Run.Status.RUNNING, heartbeats={"loop": beat("legacy@gpu-9")})
    shown = worker_detail.detail("legacy@gpu-9")
    assert shown["heartbeat_age_s"] is None and [h["run_name"] for h in shown["holds"]] == ["old worker"]
    assert [one["how"] for one in shown["history"]] == ["holding"]
