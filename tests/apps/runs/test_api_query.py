"""Every route of /api/ refuses a query parameter it does not read, naming it with the closest one it
does: `GET /api/runs/?stauts=stopped` answered 200 with every run, and `experiences/?min_rewad=1`
every row, as if unfiltered (docs/security.md, "Bad input"). The routes are walked from the API's
own URL list, so a route added later is checked too."""
import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for, urlpatterns
from apps.runs.api.routes import openapi_schema
from apps.runs.models import Run, Sweep
from apps.tasksets.models import Taskset


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


@pytest.fixture
def urls(researcher, make_run):
    """{URL name: its address}, every route of the API, each naming an object that exists."""
    run = make_run()
    sweep = Sweep.objects.create(name="s", owner=researcher, method="grid", space=[], count=0, base_config={})
    Taskset.objects.create(name="sums")
    ids = {"api-sweep": sweep.pk, "api-taskset-import": 1, "api-taskset": "sums"}  # else a run's
    return {pattern.name: reverse(pattern.name, kwargs={key: ids.get(pattern.name, run.pk)
                                                        for key in pattern.pattern.converters})
            for pattern in urlpatterns}


def query_parameters() -> dict[str, list[str]]:
    """{path: the query parameters its GET documents} from /api/openapi.json."""
    return {path: [p["name"] for p in operations["get"].get("parameters", []) if p["in"] == "query"]
            for path, operations in openapi_schema()["paths"].items() if "get" in operations}


def test_every_route_refuses_a_query_parameter_it_does_not_read(script, urls):
    answered = []
    for name, url in urls.items():
        response = script.get(url, {"bogus_key": "1"})
        if response.status_code == 405:  # a POST-only route (pause, resume, stop): below
            continue
        assert response.status_code == 400, (name, response.content)
        assert response["Content-Type"] == "application/json"
        answer = response.json()
        assert answer["error"] == "unknown query parameter: 'bogus_key'", (name, answer)
        assert answer["errors"][0]["key"] == "bogus_key"
        answered.append(name)
    assert len(answered) == 18, answered  # every GET route, the index and the schema included


def test_a_control_refuses_a_query_parameter_and_changes_nothing(script, urls):
    run = Run.objects.get()
    response = script.post(urls["api-run-stop"] + "?force=1")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [{"key": "force", "message": "unknown query parameter; known query "
                                                                      "parameters: none"}]
    run.refresh_from_db()
    assert run.status == "queued"


@pytest.mark.parametrize("name, typo, meant", [
    ("api-runs", "stauts", "status"),
    ("api-run-experiences", "min_rewad", "min_reward"),
    ("api-run-metrics", "limt", "limit"),
    ("api-run-experiences", "afterid", "after_id"),
    ("api-tasksets", "pagesize", "page_size"),
])
def test_a_misspelt_filter_is_named_with_the_one_meant(script, urls, name, typo, meant):
    response = script.get(urls[name], {typo: "1"})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [{"key": typo, "message": f"unknown query parameter; did you mean '{meant}'?"}]


def test_a_route_with_no_parameters_says_it_reads_none(script, urls):
    response = script.get(urls["api-workers"], {"verbose": "1", "x": "2"})
    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == "unknown query parameters: 'verbose', 'x'"
    assert answer["errors"][0]["message"] == "unknown query parameter; known query parameters: none"


def test_every_documented_query_parameter_is_still_read(script, urls):
    """What /api/openapi.json lists for each GET is what its route takes: none of them is refused."""
    by_path = {url.removesuffix("/").rsplit("/api", 1)[-1]: url for url in urls.values()}
    checked = 0
    for path, parameters in query_parameters().items():
        concrete = next(url for suffix, url in by_path.items()
                        if _matches(path.removeprefix("/api").removesuffix("/"), suffix))
        for parameter in parameters:
            response = script.get(concrete, {parameter: "1"})
            if response.status_code == 400:
                assert "unknown query parameter" not in response.json()["error"], (path, parameter, response.json())
            checked += 1
    assert checked >= 20  # runs 6, experiences 8, metrics 4, tasksets 2+2, sweeps 2


def test_known_filters_filter_as_before(script, make_run):
    make_run(name="a", status="stopped")
    make_run(name="b")
    answer = script.get(reverse("api-runs"), {"status": "stopped", "page_size": "10"}).json()
    assert [run["name"] for run in answer["results"]] == ["a"]


def test_an_anonymous_caller_gets_401_first(db):
    response = Client().get(reverse("api-runs"), {"stauts": "stopped"})
    assert response.status_code == 401


def _matches(template: str, concrete: str) -> bool:
    """'/runs/{pk}' against '/runs/7'."""
    parts, sent = template.split("/"), concrete.split("/")
    return len(parts) == len(sent) and all(p == s or p.startswith("{") for p, s in zip(parts, sent, strict=True))
