"""A script drives the product through the API alone (issue #44, item 7), as /api/ and its docs
guide it, with a researcher's bearer token: it uploads a taskset with a field mapping and follows
its import, reads it back a page at a time, launches a run on it, follows the run's experiences
while it writes them (the `after_id` cursor: each once, in id order) with the human judgements they
received (a comparison under both responses, saying which won), and downloads the run page's
metrics and the judgements as JSONL with the same token. A bad upload is refused naming the
field, and an import that fails says why and leaves no taskset. Embedded (the import job and the run on
threads of this process, as `make demo` without DATABASE_URL); the API's routes are the same
full stack (tests/apps/runs/test_api.py)."""
import json
import threading
from itertools import groupby

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from apps.buffer.models import Experience
from apps.feedback import services as feedback
from apps.runs.api import token_for
from apps.tasksets.models import Taskset
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def jsonl(rows) -> SimpleUploadedFile:
    return SimpleUploadedFile("sums.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())


def finished_import(client: Client, answer) -> dict:
    assert answer.status_code == 202, answer.content
    url = answer.json()["url"]
    return wait_for(lambda: (state := client.get(url).json())["status"] in ("succeeded", "failed") and state,
                    timeout=60, what="the import")


def a_pair(run_id: int, *, besides: Experience) -> list[Experience] | None:
    """Two responses to one prompt (a group of the run's) that `besides` is not in, in id order."""
    rows = Experience.objects.filter(run_id=run_id).exclude(group_id=besides.group_id)
    rows = rows.order_by("explorer_step", "group_id", "pk")
    for _, group in groupby(rows, key=lambda e: (e.explorer_step, e.group_id)):
        if len(pair := list(group)[:2]) == 2:
            return pair
    return None


class Follower:
    """A script following a run's experiences with the cursor, as docs/api.md's follow_experiences."""

    def __init__(self, client: Client, run_url: str):
        self.client, self.run_url, self.after, self.read = client, run_url, 0, []

    def poll(self) -> bool:
        """One call; whether it read everything there is so far."""
        page = self.client.get(f"{self.run_url}experiences/?after_id={self.after}&page_size=5").json()
        self.read += [experience["id"] for experience in page["results"]]
        self.after = page["next_after_id"]
        return page["count"] == len(page["results"])

    def read_twelve(self) -> bool:
        self.poll()  # caught up or not: a run on a quick machine writes faster than 5 rows a call
        return len(self.read) >= 12


def test_a_script_uploads_a_taskset_launches_a_run_and_downloads_what_it_wrote_with_feedback(
        researcher, annotator, settings):
    settings.RFTWEB_EMBEDDED = True
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    endpoints = client.get("/api/").json()["endpoints"]
    assert "POST Upload a taskset" in endpoints["/api/tasksets/"]
    rows = [{"question": f"What is {a} + {a + 1}?", "solution": str(2 * a + 1), "level": a % 3} for a in range(16)]

    refused = client.post("/api/tasksets/", {"file": jsonl(rows)})
    assert refused.status_code == 400 and "name" in refused.json()["errors"]
    failed = finished_import(client, client.post("/api/tasksets/", {"file": jsonl(rows), "name": "unmapped"}))
    assert failed["status"] == "failed" and "prompt" in failed["error"], failed  # the file has no `prompt`
    assert not Taskset.objects.filter(name="unmapped").exists()  # nothing half-imported

    done = finished_import(client, client.post("/api/tasksets/", {
        "file": jsonl(rows), "name": "api-sums", "prompt_field": "question", "answer_field": "solution",
        "metadata_fields": "level"}))
    assert done["status"] == "succeeded" and done["taskset"] == "api-sums"
    listed = client.get("/api/tasksets/").json()
    assert [t["name"] for t in listed["results"]] == ["api-sums"] and listed["results"][0]["tasks"] == 16
    page = client.get("/api/tasksets/api-sums/?page=2&page_size=5").json()["task_page"]
    assert (page["count"], page["pages"], [t["index"] for t in page["results"]]) == (16, 4, [5, 6, 7, 8, 9])
    assert page["results"][0]["prompt"] == "What is 5 + 6?" and page["results"][0]["metadata"] == {"level": 2}

    launched = client.post("/api/runs/", json.dumps({"name": "from a script", "config": {
        "model": {"path": "tiny"}, "algorithm": {"name": "grpo", "repeat_times": 2},
        "explorer": {"batch_size": 4, "max_new_tokens": 6}, "trainer": {"micro_batch_size": 8, "total_steps": 400},
        "buffer": {"taskset": "api-sums"}}}), content_type="application/json")
    assert launched.status_code == 201, launched.content
    run_id = launched.json()["id"]
    run_url = f"/api/runs/{run_id}/"
    follower = Follower(client, run_url)
    try:
        rated = wait_for(lambda: Experience.objects.filter(run_id=run_id).order_by("pk").first(), timeout=120,
                         what="the run's first rollouts")
        feedback.rate(rated.pk, annotator, "4", comment="close")  # an annotator judges while it trains
        lost, won = wait_for(lambda: a_pair(run_id, besides=rated), timeout=120, what="a second group")
        feedback.compare(lost.pk, won.pk, annotator, "b_better")  # two responses to one prompt
        wait_for(follower.read_twelve, timeout=120, what="12 rows read as the run writes them")
        assert client.post(f"{run_url}stop/").status_code == 200
        wait_for(lambda: client.get(run_url).json()["status"] == "stopped", timeout=120, what="the run stopped")
    finally:
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], timeout=60,
                 what="the run's threads to end")

    while not follower.poll():  # what it wrote until it stopped
        pass
    stored = Experience.objects.filter(run_id=run_id)
    assert follower.read == sorted(stored.values_list("pk", flat=True)), "each row once, in id order"
    got = client.get(f"{run_url}experiences/?page_size=500").json()
    assert got["count"] == stored.count() >= 8 and {e["id"] for e in got["results"]} == set(follower.read)
    by_id = {e["id"]: e for e in got["results"]}
    (judgement,) = by_id[rated.pk]["feedback"]
    assert (judgement["kind"], judgement["label"], judgement["comment"], judgement["annotator"]) == (
        "rating", "4", "close", annotator.username)
    (on_lost,), (on_won,) = by_id[lost.pk]["feedback"], by_id[won.pk]["feedback"]
    assert (on_lost["kind"], on_lost["other"], on_lost["preferred"]) == ("preference", won.pk, False)
    assert (on_won["kind"], on_won["other"], on_won["preferred"]) == ("preference", lost.pk, True)
    assert all(e["feedback"] == [] for i, e in by_id.items() if i not in (rated.pk, lost.pk, won.pk))
    # the run page's downloads take the same token: its metrics and the judgements, as files
    metrics = json.loads(b"".join(client.get(f"/runs/{run_id}/metrics.json")))
    assert metrics["run"] == run_id and metrics["metrics"]["explorer"], metrics.keys()
    jsonl_lines = b"".join(client.get(f"/annotate/runs/{run_id}/feedback.jsonl")).splitlines()
    exported = [json.loads(line) for line in jsonl_lines]
    assert [(row["experience"], row["kind"]) for row in exported] == [(rated.pk, "rating"), (won.pk, "preference")]
    assert (exported[1]["a"], exported[1]["b"], exported[1]["chosen"]) == (lost.pk, won.pk, won.pk)  # as the API
    progress = client.get(f"{run_url}annotation/").json()  # how far the annotators got
    assert progress["judgements"] == {"rating": 1, "edit": 0, "preference": 1, "flag": 0}
    assert progress["rated_experiences"] == 1 and progress["dpo_pairs"] == 1
    assert progress["per_annotator"] == [
        {"annotator": annotator.username, "kind": kind, "count": 1, "mean_seconds": 0.0, "pending": 0, "accepted": 0,
         "rejected": 0} for kind in ("preference", "rating")]
