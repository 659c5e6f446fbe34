"""The API's OpenAPI document (/api/openapi.json) and docs page (/api/docs/): the document is valid
OpenAPI 3, lists exactly the API's routes, and every operation it lists answers a real call with a
status it documents and a body that matches the documented schema."""

import json
import re
import shutil
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse
from django.utils import timezone
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.api import token_for
from apps.runs.models import Checkpoint, MetricPoint, Run, Sweep, Worker
from apps.runs.presets import preset_config
from apps.runs.supervision import run_dir
from apps.saved_models.services import models_root

Status = Run.Status
# Under /api/ but not JSON operations: the token and docs pages (HTML) and the document itself.
NOT_OPERATIONS = {"api-token", "api-docs", "api-schema"}
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


@pytest.fixture
def spec(script) -> dict:
    response = script.get(reverse("api-schema"))
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    return response.json()


@pytest.fixture
def busy_run(make_run, researcher):
    """A running run with something in every list: a live worker holding its duty, a checkpoint,
    metrics and two rollouts, compared (a judgement listed under both)."""
    now = timezone.now()
    Worker.objects.create(name="runs@gpu-1", host="gpu-1", pid=4242, queues=["train"], slots=1,
                          started_at=now - timedelta(hours=1), last_seen=now)
    beat = {"at": now.isoformat(), "worker": "gpu-1:4242", "node": "runs@gpu-1", "since": now.isoformat(),
            "started": now.isoformat()}
    run = make_run("busy", status=Status.RUNNING, config=preset_config("quick-demo"), heartbeats={"loop": beat})
    directory = run_dir(run) / "checkpoints" / "v1"  # on disk: the API saves it as a model
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    Checkpoint.objects.create(run=run, version=1, step=5, path=str(directory))
    MetricPoint.objects.create(run=run, role="explorer", step=5, values={"reward_mean": 0.5})
    rollouts = [Experience.objects.create(run=run, explorer_step=5, group_id="g", prompt_text="1+1?",
                                          response_text=text, prompt_ids=[1], response_ids=[2], action_mask=[1],
                                          reward=1.0, model_version=1) for text in ("2", "3")]
    Feedback.objects.create(experience=rollouts[0], other=rollouts[1], user=researcher, kind="preference", value=1.0,
                            label="a_better")
    yield run
    shutil.rmtree(run_dir(run), ignore_errors=True)
    shutil.rmtree(models_root() / MODEL, ignore_errors=True)


def operations(spec):
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def api_routes() -> dict[str, str]:
    """{OpenAPI-style path: URL name} of every URL under /api/ that the resolver knows."""
    routes = {}

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("api/"):
                routes["/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)] = pattern.name

    walk(get_resolver().url_patterns, "")
    return routes


def test_the_document_is_valid_openapi_3(spec):
    validate(spec)  # raises, naming the problem, when it is not
    assert spec["openapi"].startswith("3.")
    schemes = spec["components"]["securitySchemes"]
    assert {scheme["type"] for scheme in schemes.values()} == {"http", "apiKey"}  # bearer token, session


def test_every_api_route_is_documented_and_every_documented_path_resolves(spec):
    documented = {path: name for path, name in api_routes().items() if name not in NOT_OPERATIONS}
    assert set(spec["paths"]) == set(documented)
    for path in spec["paths"]:
        assert resolve(path.replace("{pk}", "1")).url_name == documented[path]


def test_every_operation_documents_its_answers_and_its_auth(spec):
    for path, method, operation in operations(spec):
        answers = operation["responses"]
        assert {"401", "403"} <= set(answers), (method, path)
        assert any(status.startswith("2") for status in answers), (method, path)
        assert "$ref" in json.dumps(answers), (method, path)  # real bodies, not {}
        assert operation["summary"] and operation["security"], (method, path)


def request_body(path, method, operation, run) -> dict | None:
    """A valid body for each operation that takes one (a new one must be added here)."""
    bodies = {("post", "/api/runs/"): {"name": "documented", "config": preset_config("quick-demo")},
              ("post", "/api/tasksets/"): None,  # multipart, sent by the test below
              ("post", "/api/sweeps/"): {"name": "documented sweep", "config": preset_config("quick-demo"),
                                         "space": [{"key": "trainer.lr", "values": [1e-4, 1e-3]}]},
              ("post", "/api/models/"): {"run": run.pk, "version": 1, "name": MODEL},
              # the items GET /api/runs/{pk}/bulk-flag/?reward_min=0 names: the run's two, newest first
              ("post", "/api/runs/{pk}/bulk-flag/"): {"filter": BULK_FILTER, "reason": "wrong", "items": list(
                  run.experiences.order_by("-explorer_step", "-pk").values_list("pk", flat=True))},
              ("post", "/api/runs/{pk}/bulk-flag/undo/"): {"feedback": []},
              ("post", "/api/models/{name}/aliases/"): {"alias": "champion"},
              ("patch", "/api/models/{name}/"): {"name": MODEL}}  # its own name: changes nothing
    if "requestBody" in operation:
        return bodies[(method, path)]
    return None


BULK_FILTER = {"reward_min": "0"}  # a bulk flag's count needs a filter
QUERIES = {("get", "/api/runs/{pk}/bulk-flag/"): BULK_FILTER}
MODEL = "documented-model"  # saved from busy_run's checkpoint by POST /api/models/, then deleted

# What each control needs the run to be in to be offered.
STATUS_BEFORE = {"pause": Status.RUNNING, "resume": Status.PAUSED, "stop": Status.RUNNING}


# A curator's: draining a worker is theirs alone.
CURATORS = {("post", "/api/workers/{name}/drain/"), ("post", "/api/workers/{name}/undrain/")}


def test_each_documented_operation_answers_a_token_as_documented(spec, script, busy_run, tasksets, worker_queue,
                                                                 researcher, curator, monkeypatch):
    import rftweb.celery
    from apps.core import jobs
    from apps.tasksets.models import TasksetImport

    monkeypatch.setattr(jobs, "enqueue_job", lambda job: None)  # the upload's import is not run here
    # The worker's answer to a drain (tests/workers/test_drain.py drains a real one).
    monkeypatch.setattr(rftweb.celery, "set_consuming", lambda worker, queues, consume: True)
    curators = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}")
    job = TasksetImport.objects.create(original_filename="a.jsonl", name="uploaded", format="jsonl",
                                       default_workflow="single_turn", default_reward_fn="exact_match",
                                       created_by=researcher)
    sweep = Sweep.objects.create(name="s", owner=researcher, method="grid", space=[], count=0, base_config={})
    ids = {"/api/tasksets/imports/{pk}/": job.pk, "/api/sweeps/{pk}/": sweep.pk}
    now = timezone.now()
    worker = Worker.objects.create(name="train@gpu-1", host="elsewhere", pid=1, queues=["train"], slots=1,
                                   started_at=now, last_seen=now)
    called = 0
    for path, method, operation in operations(spec):
        action = path.rstrip("/").rsplit("/", 1)[-1]
        if action in STATUS_BEFORE:
            Run.objects.filter(pk=busy_run.pk).update(status=STATUS_BEFORE[action])
        name = (MODEL if path.startswith("/api/models/") else worker.name if path.startswith("/api/workers/")
                else tasksets[0].name)
        url = path.replace("{pk}", str(ids.get(path, busy_run.pk))).replace("{name}", name).replace(
            "{alias}", "champion")  # set by the POST before
        if (method, path) == ("post", "/api/tasksets/"):  # multipart: a file and its form fields
            upload = SimpleUploadedFile("sums.jsonl", b'{"prompt": "1+1?", "answer": "2"}\n')
            response = script.post(url, {"file": upload, "name": "documented-upload"})
        else:
            body = request_body(path, method, operation, busy_run)
            if method == "get":
                response = script.get(url, QUERIES.get((method, path)))
            else:
                client = curators if (method, path) in CURATORS else script
                response = getattr(client, method)(url, json.dumps(body) if body else None,
                                                   content_type="application/json")
        assert_documented(spec, operation, response, (method, path))
        called += 1
    assert called == len(list(operations(spec))) >= 11
    assert Run.objects.filter(name="documented").exists()


def assert_documented(spec, operation, response, what):
    """The answer has a 2xx status the operation documents, and a body its schema for it takes."""
    status = str(response.status_code)
    assert status.startswith("2") and status in operation["responses"], (what, response.content[:300])
    if status == "204":
        assert response.content == b"" and "content" not in operation["responses"][status], what
        return
    documented = operation["responses"][status]["content"]["application/json"]["schema"]
    errors = list(OAS31Validator({**documented, "components": spec["components"]}).iter_errors(response.json()))
    assert errors == [], (what, [error.message for error in errors])


@pytest.mark.parametrize("path, query", [
    ("/api/runs/{pk}/experiences/", {"after_id": 0, "page_size": 1}),
    ("/api/runs/{pk}/metrics/", {"limit": 1, "keys": "reward_mean", "role": "explorer", "since": 0}),
])
def test_the_cursors_answer_as_documented(spec, script, busy_run, path, query):
    """What the routes add with a cursor (next_after_id; next_since, more) is in the document too."""
    response = script.get(path.replace("{pk}", str(busy_run.pk)), query)
    assert_documented(spec, spec["paths"][path]["get"], response, (path, query))
    assert {name for name in query} <= {p["name"] for p in spec["paths"][path]["get"]["parameters"]}


def test_each_documented_operation_refuses_no_token_with_its_documented_401(spec):
    for path, method, operation in operations(spec):
        response = getattr(Client(), method)(path.replace("{pk}", "1"))
        assert response.status_code == 401 and "401" in operation["responses"], (method, path)
        assert response.json()["error"] == "log in, or send Authorization: Bearer <token>"


def test_the_index_links_the_live_docs_the_schema_and_every_path(script, spec):
    index = script.get(reverse("api-index")).json()
    assert index["docs"].endswith(reverse("api-docs")) and index["schema"].endswith(reverse("api-schema"))
    assert set(index["endpoints"]) == set(spec["paths"])
    assert index["endpoints"]["/api/runs/"] == "GET List runs · POST Launch a run"


def test_the_docs_page_is_swagger_ui_from_this_site(researcher_client):
    page = researcher_client.get(reverse("api-docs"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and reverse("api-schema") in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "the page must load nothing from another site"


def test_a_session_post_with_the_csrf_token_passes(researcher, make_run):
    """The docs page's "Try it out" and the pages send the session and the X-CSRFToken header."""
    run = make_run(status=Status.RUNNING)
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    client.get(reverse("api-docs"))  # sets the CSRF cookie, as any page does
    response = client.post(reverse("api-run-pause", args=[run.pk]), HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 200 and response.json()["status"] == Status.PAUSED


def test_a_wrong_method_is_json_naming_the_right_ones(script, make_run):
    response = script.delete(reverse("api-runs"))
    assert response.status_code == 405 and response.json() == {"error": "use GET or POST"}
    assert sorted(response["Allow"].split(", ")) == ["GET", "POST"]


def leaves(schema: dict, prefix: str = ""):
    """(dotted key, property schema) of every key the config schema types."""
    for name, prop in schema["properties"].items():
        section = next((s for s in prop.get("anyOf", [prop]) if "properties" in s), None)
        yield prefix + name, prop
        if section is not None:
            yield from leaves(section, prefix + name + ".")


def test_the_run_config_is_typed_key_by_key(spec):
    """Issue #45: the launch body's config, a run's config and a sweep's base each carry the run
    config's schema: every key with a type, its default, its bounds or choices and a description,
    and no key outside it."""
    from workers.rft.config_docs import rows

    launch = spec["paths"]["/api/runs/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    taken = launch["properties"]["config"]["anyOf"][0]
    detail = spec["components"]["schemas"]["RunDetailOut"]["properties"]["config"]
    sweep = spec["paths"]["/api/sweeps/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    sweep = sweep["properties"]["config"]["anyOf"][0]
    assert taken == sweep and detail["properties"] == taken["properties"] and not detail["additionalProperties"]
    typed = dict(leaves(taken))
    assert list(typed) == [key for key, *_ in rows()]  # the docs' table lists the same keys
    assert taken["additionalProperties"] is False
    for key, prop in typed.items():
        assert prop.get("description"), key
        assert "type" in prop or "anyOf" in prop, key
    assert typed["trainer.lr"] == {"default": 1e-05, "description": "the policy's learning rate",
                                   "exclusiveMinimum": 0, "maximum": 1.0, "type": "number"}
    assert typed["algorithm.kl.fn"]["enum"] == ["k1", "k2", "k3", "low_var_kl", "none"]
    assert typed["trainer.batch_size"]["anyOf"] == [{"maximum": 65536, "minimum": 1, "type": "integer"},
                                                    {"type": "null"}]
