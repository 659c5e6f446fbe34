"""Addresses under /api/ that name nothing: a path id that is not a whole number is a missing
object (404 in the API's shape, never ninja's 422), and a path without its trailing slash is a 308
to the slashed one, which keeps a POST a POST (Django's 301 made a script's launch a GET of the run
list, and a 500 under DEBUG)."""
import json

import pytest
from django.test import Client
from django.urls import reverse
from ninja.errors import ValidationError

from apps.runs.api import token_for
from apps.runs.api.auth import invalid_request
from apps.runs.models import Run
from apps.runs.presets import preset_config


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


NOT_IDS = {
    "run-word": ("get", "/api/runs/abc/", "no run 'abc'"),
    "run-fraction": ("get", "/api/runs/1.5/", "no run '1.5'"),
    "run-float-spelling": ("get", "/api/runs/1.0/", "no run '1.0'"),  # pydantic read it as run 1
    "run-underscore": ("get", "/api/runs/1_0/", "no run '1_0'"),  # pydantic read it as run 10
    "run-metrics": ("get", "/api/runs/abc/metrics/", "no run 'abc'"),
    "run-control": ("post", "/api/runs/abc/pause/", "no run 'abc'"),
    "sweep": ("get", "/api/sweeps/x/", "no sweep 'x'"),
    "taskset-import": ("get", "/api/tasksets/imports/x/", "no taskset import 'x'"),
}


@pytest.mark.parametrize("method, url, words", NOT_IDS.values(), ids=NOT_IDS.keys())
def test_a_path_id_that_is_not_a_whole_number_is_a_json_404_naming_it(script, make_run, method, url, words):
    make_run()  # run 1 exists: "1.0" must not reach it
    response = getattr(script, method)(url)
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert words in body["error"] and "detail" not in body, body


def test_any_other_invalid_parameter_is_a_400_in_the_apis_shape(rf):
    """Ninja's own answer to a parameter it cannot read is a 422 {"detail": [...]}."""
    refused = ValidationError([{"loc": ("query", "page"), "msg": "Input should be a valid string", "type": "x"}])
    response = invalid_request(rf.get("/api/runs/"), refused)
    assert response.status_code == 400
    assert json.loads(response.content) == {
        "error": "invalid request: query.page: Input should be a valid string",
        "errors": [{"key": "query.page", "message": "Input should be a valid string"}],
    }


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_a_launch_without_the_trailing_slash_is_a_308_that_launches(script, tasksets, worker_queue, settings, debug):
    settings.DEBUG = debug
    body = json.dumps({"name": "slashless", "config": preset_config("quick-demo")})
    response = script.post("/api/runs", body, content_type="application/json")
    assert response.status_code == 308, response.content[:300]
    assert response["Location"] == "/api/runs/"
    assert "/api/runs/" in response.json()["error"]
    assert not Run.objects.exists()

    followed = script.post("/api/runs", body, content_type="application/json", follow=True)
    assert followed.status_code == 201, followed.content[:300]  # a POST again, with its body
    assert Run.objects.get().name == "slashless"


def test_a_read_without_the_trailing_slash_is_a_308_keeping_the_query(script, make_run):
    make_run("alpha", status=Run.Status.RUNNING)
    response = script.get("/api/runs", {"status": "running"})
    assert response.status_code == 308 and response["Location"] == "/api/runs/?status=running"
    followed = script.get("/api/runs", {"status": "running"}, follow=True)
    assert [run["name"] for run in followed.json()["results"]] == ["alpha"]


def test_an_address_that_no_slash_rescues_is_still_a_json_404(script):
    response = script.post("/api/nothing-here", "{}", content_type="application/json")
    assert response.status_code == 404 and response.json() == {"error": "not found: /api/nothing-here"}


def test_pages_keep_djangos_own_slash_redirect(researcher_client):
    response = researcher_client.get("/runs")
    assert response.status_code == 301 and response["Location"] == reverse("run-list")
