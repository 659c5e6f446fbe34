"""What the API's POST bodies take: a launch's and a sweep's fields by name (an unknown one is
refused naming the closest known one, `config` is required), and a taskset upload as
multipart/form-data with one of each part."""
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Run, Sweep
from apps.runs.presets import preset_config
from apps.tasksets.models import TasksetImport


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


def post_json(client, url, body):
    return client.post(url, json.dumps(body), content_type="application/json")


# ---- launching a run -----------------------------------------------------------------------------


def test_a_launch_with_a_misspelt_field_is_refused_naming_it_and_the_closest_one(script, tasksets, worker_queue):
    """{"configuration": ...} launched a run on the default config, the sent one ignored."""
    response = post_json(script, reverse("api-runs"), {"name": "x", "configuration": preset_config("quick-demo")})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["errors"] == [{"key": "configuration", "message": "unknown field; did you mean 'config'?"}]
    assert "configuration" in body["error"]
    assert not Run.objects.exists() and worker_queue == []


def test_an_unknown_field_far_from_any_known_one_lists_them(script, tasksets, worker_queue):
    response = post_json(script, reverse("api-runs"), {"config": {}, "priority": 3})
    assert response.status_code == 400
    assert response.json()["errors"] == [{"key": "priority", "message": "unknown field; known fields: name, config"}]


@pytest.mark.parametrize("body", [{}, {"name": "x"}, {"name": "x", "config": None}], ids=["empty", "no-config", "null"])
def test_a_launch_without_config_is_refused(script, tasksets, worker_queue, body):
    response = post_json(script, reverse("api-runs"), body)
    assert response.status_code == 400, response.content
    (problem,) = response.json()["errors"]
    assert problem["key"] == "config" and "{}" in problem["message"]
    assert not Run.objects.exists()


def test_an_empty_config_means_the_defaults(script, tasksets, worker_queue):
    response = post_json(script, reverse("api-runs"), {"name": "defaults", "config": {}})
    assert response.status_code == 201, response.content
    assert Run.objects.get().name == "defaults"


def test_the_documented_launch_body_says_which_fields_it_takes(script):
    spec = script.get(reverse("api-schema")).json()
    launch = spec["paths"]["/api/runs/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert launch["required"] == ["config"] and launch["additionalProperties"] is False
    name = launch["properties"]["name"]
    assert name["maxLength"] == 200 and "kept" not in name["description"]  # a longer name is refused, not cut


# ---- launching a sweep ---------------------------------------------------------------------------


def sweep_body(**changes):
    space = [{"key": "trainer.lr", "values": [1e-4, 1e-3]}]
    return {"name": "s", "config": preset_config("quick-demo"), "space": space, **changes}


SWEEP_REFUSALS = {
    "misspelt-field": (sweep_body(methd="random"), "methd", "unknown field; did you mean 'method'?"),
    "no-config": ({k: v for k, v in sweep_body().items() if k != "config"}, "config", "{}"),
    "count-on-a-grid": (sweep_body(count=4), "count", "grid"),
    "low-beside-values": (
        sweep_body(space=[{"key": "trainer.lr", "values": [1e-4, 1e-3], "low": 1e-5}]), "trainer.lr", "'low'"),
    "misspelt-axis-field": (sweep_body(space=[{"key": "trainer.lr", "vals": [1e-4]}]), "trainer.lr",
                            "unknown field 'vals'; did you mean 'values'?"),
}


@pytest.mark.parametrize("body, key, words", SWEEP_REFUSALS.values(), ids=SWEEP_REFUSALS.keys())
def test_a_sweep_body_with_a_field_it_does_not_take_is_refused_naming_it(script, tasksets, worker_queue, body, key,
                                                                         words):
    response = post_json(script, reverse("api-sweeps"), body)
    assert response.status_code == 400, response.content
    problems = response.json()["errors"]
    assert any(p["key"] == key and words in p["message"] for p in problems), problems
    assert not Sweep.objects.exists() and not Run.objects.exists()


def test_the_sweep_body_as_documented_still_launches(script, tasksets, worker_queue):
    grid = post_json(script, reverse("api-sweeps"), sweep_body())
    assert grid.status_code == 201, grid.content
    space = [{"key": "trainer.lr", "low": 1e-5, "high": 1e-3, "scale": "log"}]
    drawn = post_json(script, reverse("api-sweeps"), sweep_body(method="random", count=2, seed=1, space=space))
    assert drawn.status_code == 201, drawn.content
    assert Run.objects.count() == 4


# ---- uploading a taskset -------------------------------------------------------------------------


def jsonl(name="sums.jsonl"):
    return SimpleUploadedFile(name, b'{"prompt": "1+1?", "answer": "2"}\n')


@pytest.fixture
def no_import(monkeypatch):
    from apps.core import jobs

    monkeypatch.setattr(jobs, "enqueue_job", lambda job: None)


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_an_upload_that_is_not_multipart_is_a_415_saying_how_to_send_it(script, no_import, content_type):
    """A JSON body got `name: This field is required.`, though it named the taskset."""
    body = json.dumps({"name": "sums"}) if content_type == "application/json" else "name=sums"
    response = script.post(reverse("api-tasksets"), body, content_type=content_type)
    assert response.status_code == 415, response.content
    error = response.json()["error"]
    assert "multipart/form-data" in error and "`file`" in error and "name" in error and "prompt_field" in error
    assert not TasksetImport.objects.exists()


@pytest.mark.parametrize("field", ["file", "name", "prompt_field"])
def test_an_upload_sending_a_field_twice_is_refused_naming_it(script, no_import, field):
    data = {"file": jsonl(), "name": "sums", "prompt_field": "prompt"}
    data[field] = [jsonl("a.jsonl"), jsonl("b.jsonl")] if field == "file" else ["one", "two"]
    response = script.post(reverse("api-tasksets"), data)
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["error"] and list(body["errors"]) == [field]
    assert not TasksetImport.objects.exists()


def test_an_upload_with_a_description_over_2000_characters_is_a_400(script, no_import):
    """100 KB was taken and kept: a description is a paragraph on the taskset's page."""
    response = script.post(reverse("api-tasksets"), {"file": jsonl(), "name": "sums", "description": "d" * 100_000})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"description": ["Ensure this value has at most 2000 characters "
                                                         "(it has 100000)."]}
    assert not TasksetImport.objects.exists()


def test_a_multipart_upload_still_starts_an_import(script, no_import):
    response = script.post(reverse("api-tasksets"), {"file": jsonl(), "name": "sums"})
    assert response.status_code == 202, response.content
    assert TasksetImport.objects.get().name == "sums"


@pytest.mark.parametrize("field, closest", [("promt_field", "prompt_field"), ("upload", None)])
def test_an_upload_with_a_field_it_does_not_take_is_refused_naming_it(script, no_import, field, closest):
    """`-F promt_field=question` was a 202 that imported the `prompt` column, the misspelt field ignored;
    a file sent as `upload` is named too, rather than answered 'file: This field is required.'"""
    data = {"name": "sums", field: jsonl() if field == "upload" else "question"}
    if field != "upload":
        data["file"] = jsonl()
    response = script.post(reverse("api-tasksets"), data)
    assert response.status_code == 400, response.content
    body = response.json()
    assert repr(field) in body["error"]
    assert [problem["key"] for problem in body["errors"]] == [field]
    message = body["errors"][0]["message"]
    assert f"did you mean {closest!r}" in message if closest else "known fields: file, name" in message
    assert not TasksetImport.objects.exists()


def test_an_upload_from_a_session_form_may_carry_its_csrf_token(researcher, no_import):
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    token = client.cookies["csrftoken"] = "t" * 32  # a CSRF secret, which Django takes as the token too
    response = client.post(reverse("api-tasksets"), {"file": jsonl(), "name": "sums", "csrfmiddlewaretoken": token})
    assert response.status_code == 202, response.content
