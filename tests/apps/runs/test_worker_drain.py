"""A curator drains a worker (capacity.set_drain): it finishes what it holds and takes no new duty,
shown as draining on its page, the Workers page and /api/workers/; undrained, it takes duties
again. Here the broker is the tests' real Redis with no worker behind it (one that does not answer
is refused, changing nothing); tests/workers/test_drain.py drains a real Celery worker."""
import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from apps.runs import capacity, turns, waits
from apps.runs.capacity import DrainRefused
from apps.runs.models import Run, Worker

NAME = "train@gpu 1/ü"


def worker(name=NAME, *, seen_ago=0.0, drain=None):
    now = timezone.now()
    return Worker.objects.create(name=name, host="elsewhere", pid=4242, queues=["train"], slots=2,
                                 started_at=now - timedelta(hours=1), last_seen=now - timedelta(seconds=seen_ago),
                                 drain=drain or {})


DRAINED = {"by": "cur", "at": "2026-01-01T00:00:00+00:00"}


def test_a_drained_worker_has_no_free_slot_and_says_so_everywhere(db, researcher_client):
    worker(drain=DRAINED)
    worker("train@gpu-2")
    assert waits.free_slots()["train"] == {"free": 2, "slots": 4, "workers": 2}  # only gpu-2's count
    data = researcher_client.get(reverse("api-workers")).json()
    assert {w["name"]: (w["drain"], w["free"]) for w in data["workers"]} == {
        NAME: (DRAINED, 0), "train@gpu-2": ({}, 2)}
    page = researcher_client.get(reverse("worker-detail", args=[NAME])).content.decode()
    shown = json.loads(page.split('id="worker-data" type="application/json">')[1].split("</script>")[0])
    assert shown["worker"]["drain"] == DRAINED
    assert 'data-drain="drain"' not in page  # a researcher sees it drained, and may not undrain it


def test_a_restarted_worker_takes_duties_again(db):
    worker(drain=DRAINED)
    capacity.register(NAME, ["train"], 2)
    assert Worker.objects.get(name=NAME).drain == {} and not capacity.draining(NAME)


def test_a_worker_that_does_not_answer_is_not_drained(db):
    worker()
    with pytest.raises(DrainRefused, match="did not answer"):
        capacity.set_drain(NAME, "cur", True)
    assert Worker.objects.get(name=NAME).drain == {}


@pytest.mark.parametrize("why", ["lost", "stopped", "unknown", "embedded"])
def test_only_a_live_celery_worker_is_drained(db, settings, why):
    row = worker(seen_ago=3600 if why == "lost" else 0)
    if why == "stopped":
        Worker.objects.filter(pk=row.pk).update(stopped_at=timezone.now())
    if why == "embedded":
        settings.RFTWEB_EMBEDDED = True
    name = "nobody@nowhere" if why == "unknown" else NAME
    with pytest.raises(DrainRefused, match="embedded" if why == "embedded" else "not live"):
        capacity.set_drain(name, "cur", True)
    assert Worker.objects.get(pk=row.pk).drain == {}


def test_a_task_that_reaches_a_drained_worker_goes_back_to_its_queue(db):
    worker(drain=DRAINED)
    worker("train@gpu-2")
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete("train")
    assert not turns.turn_away("train@gpu-2", 7, "trainer", "task-1")  # not drained: it serves
    assert not turns.turn_away(NAME, 7, "trainer", None)  # embedded-style, no task: serves
    assert client.llen("train") == 0
    assert turns.turn_away(NAME, 7, "trainer", "task-1")
    (message,) = [json.loads(raw) for raw in client.lrange("train", 0, -1)]
    assert message["headers"]["id"] == "task-1" and message["headers"]["argsrepr"] == "(7, 'trainer')"
    client.delete("train")


def test_drain_is_a_curators_post_and_a_refusal_says_why(db, client, curator, researcher):
    worker(seen_ago=3600)  # lost: refused with a message, nothing changed
    url = reverse("worker-drain", args=[NAME])
    assert url == "/workers/train@gpu%201/%C3%BC/drain/"
    client.force_login(researcher)
    assert client.post(url).status_code == 403
    client.force_login(curator)
    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    assert response.redirect_chain[0][0] == reverse("worker-detail", args=[NAME])
    assert "is not live" in response.content.decode()
    assert Worker.objects.get(name=NAME).drain == {}
    # A name no worker registered: its page is a 404, which shows no message (the message waited
    # for a later page); the Workers page says it.
    response = client.post(reverse("worker-drain", args=["nobody@nowhere"]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("worker-list") and response.status_code == 200
    assert "no worker of that name has registered" in response.content.decode()


def test_a_duty_waiting_while_every_worker_of_its_queue_is_drained_says_so(db, make_run):
    worker(drain=DRAINED)
    run = make_run("waits", status=Run.Status.STARTING, heartbeats={})
    (loop,) = waits.duty_states(run)
    assert loop.state == "waiting" and f"every live one is drained ({NAME})" in loop.detail
    Worker.objects.filter(name=NAME).update(drain={})
    assert "one has a free slot" in waits.duty_states(run)[0].detail
