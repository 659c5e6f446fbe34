"""The pages a script fetches take its API token as the API does, with the same role checks as the
session (a token got a 302 to the login page), and answer every refusal as JSON when a token came
with the request (an annotator's token got the HTML "Not for your role" page; a missing checkpoint
version an HTML 404). Without a token they are pages as before (test_access_matrix.py)."""
import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Checkpoint, MetricPoint, Run
from apps.runs.supervision import run_dir
from apps.tasksets.models import TasksetImport

from .test_access_matrix import role_users

PRINCIPALS = ("annotator", "owner", "other", "curator")
JOB_LABEL = "tasksets.tasksetimport"


@pytest.fixture
def world(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"

    class World:
        pass

    o = World()
    o.users = role_users()
    o.run = Run.objects.create(name="r", owner=o.users["owner"], config={})
    MetricPoint.objects.create(run=o.run, role="trainer", step=1, values={"loss": 0.5})
    directory = run_dir(o.run) / "checkpoints" / "v1"
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(b"w")
    Checkpoint.objects.create(run=o.run, version=1, step=1, path=str(directory))
    o.job = TasksetImport.objects.create(
        original_filename="t.jsonl", name="new-ts", format="jsonl", default_workflow="single_turn",
        default_reward_fn="exact_match", created_by=o.users["owner"],
    )
    return o


run = lambda o: [o.run.pk]  # noqa: E731
# URL name: (its args, its query, who reaches it: one letter per principal, A allowed, D 403, N 404)
REACH = {
    "run-metrics-json": (run, {}, "DAAA"),
    "run-metrics-csv": (run, {}, "DAAA"),
    "compare-metrics-json": (lambda o: [], lambda o: {"runs": [o.run.pk]}, "DAAA"),
    "compare-metrics-csv": (lambda o: [], lambda o: {"runs": [o.run.pk]}, "DAAA"),
    "run-logs": (run, {}, "DAAA"),
    "annotate-export": (run, {}, "DAAA"),
    "annotate-run-summary": (run, {}, "DAAA"),
    "checkpoint-download": (lambda o: [o.run.pk, 1], {}, "DAAA"),
    "job-progress": (lambda o: [JOB_LABEL, o.job.pk], {}, "NANA"),  # the uploader's and curators'
}
OUTCOME = {"A": 200, "D": 403, "N": 404}


def fetch(url, token, query=None):
    return Client().get(url, query or {}, HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("name", sorted(REACH))
def test_a_token_reaches_what_the_session_reaches(world, name, principal):
    args, query, expected = REACH[name]
    url = reverse(name, args=args(world))
    response = fetch(url, token_for(world.users[principal]), query(world) if callable(query) else query)
    status = OUTCOME[expected[PRINCIPALS.index(principal)]]
    assert response.status_code == status, (name, principal, response.status_code, response.get("Location"))
    if status != 200:
        assert response["Content-Type"] == "application/json" and response.json()["error"], (name, principal)


@pytest.mark.parametrize("name", sorted(REACH))
def test_a_bad_token_is_a_json_401(world, name):
    args, _, _ = REACH[name]
    response = fetch(reverse(name, args=args(world)), "rft_1_nope")
    assert response.status_code == 401 and response.json()["error"] == "invalid API token"


def test_an_annotators_token_gets_the_role_refusal_as_json(world):
    response = fetch(reverse("run-metrics-json", args=[world.run.pk]), token_for(world.users["annotator"]))
    assert response.status_code == 403 and "researcher" in response.json()["error"]


MISSING = {
    "checkpoint-version": lambda o: reverse("checkpoint-download", args=[o.run.pk, 9]),
    "run-metrics": lambda o: reverse("run-metrics-json", args=[o.run.pk + 100]),
    "run-logs": lambda o: reverse("run-logs", args=[o.run.pk + 100]),
    "feedback-export": lambda o: reverse("annotate-export", args=[o.run.pk + 100]),
    "job": lambda o: reverse("job-progress", args=[JOB_LABEL, o.job.pk + 100]),
}


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
@pytest.mark.parametrize("url", MISSING.values(), ids=MISSING.keys())
def test_a_missing_thing_is_a_json_404_for_a_token(world, settings, url, debug):
    settings.DEBUG = debug  # whose own 404 is an HTML page
    response = fetch(url(world), token_for(world.users["owner"]))
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"]


def test_a_compare_download_without_runs_is_a_json_400_for_a_token(world):
    response = fetch(reverse("compare-metrics-json"), token_for(world.users["owner"]))
    assert response.status_code == 400 and "runs=" in response.json()["error"]


def test_a_wrong_method_is_a_json_405_for_a_token_and_a_session_post_still_needs_csrf(world):
    url = reverse("job-progress", args=[JOB_LABEL, world.job.pk])
    script = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(world.users['owner'])}")
    response = script.post(url)
    assert response.status_code == 405 and response.json() == {"error": "use GET"}
    page = Client(enforce_csrf_checks=True)
    page.force_login(world.users["owner"])
    assert page.post(url).status_code == 403  # CSRF, as on every page
    assert page.get(url).status_code == 200


def test_the_metrics_a_token_downloads_are_the_runs(world):
    response = fetch(reverse("run-metrics-json", args=[world.run.pk]), token_for(world.users["other"]))
    assert b'"loss": 0.5' in b"".join(response)


def test_without_a_token_they_stay_pages(world):
    """The session's refusals are the site's pages, as before."""
    client = Client()
    client.force_login(world.users["annotator"])
    refused = client.get(reverse("run-metrics-json", args=[world.run.pk]))
    assert refused.status_code == 403 and refused["Content-Type"].startswith("text/html")
    assert Client().get(reverse("run-metrics-json", args=[world.run.pk])).status_code == 302  # the login page
