"""/api/runs/<id>/metrics/ for scripts: at most `limit` points a role (5,000 by default: a long run
answered every point, 100+ MB), `next_since` and `more` per role to go on from, and `keys=` to
keep some metrics. On Postgres and SQLite."""

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import MetricPoint

SYSTEM_START = 1_700_000_000  # a system point's step is Unix seconds
CAP = 5000  # points per role when no limit is sent (docs/api.md)


@pytest.fixture
def script(researcher):
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


@pytest.fixture
def run(make_run):
    """Trainer steps 1-7 (lr every step, loss on odd steps), explorer steps 1-3, two heartbeats."""
    run = make_run()
    points = [MetricPoint(run=run, role="trainer", step=step,
                          values={"lr": 0.1, **({"loss": 1 / step} if step % 2 else {})}) for step in range(1, 8)]
    points += [MetricPoint(run=run, role="explorer", step=step, values={"reward/mean": step / 10})
               for step in (1, 2, 3)]
    points += [MetricPoint(run=run, role="system", step=SYSTEM_START + s, values={"cpu": 50}) for s in (0, 30)]
    MetricPoint.objects.bulk_create(points)
    return run


def metrics(script, run, **query) -> dict:
    answer = script.get(reverse("api-run-metrics", args=[run.pk]), query)
    assert answer.status_code == 200, answer.content
    return answer.json()


def steps(answer: dict) -> dict[str, list[int]]:
    return {role: [point["step"] for point in points] for role, points in answer["metrics"].items()}


def test_limit_caps_each_role_and_says_where_to_go_on_from(script, run):
    answer = metrics(script, run, limit=3)

    assert steps(answer) == {"explorer": [1, 2, 3], "trainer": [1, 2, 3], "system": [SYSTEM_START, SYSTEM_START + 30]}
    assert answer["next_since"] == {"explorer": 3, "trainer": 3, "system": SYSTEM_START + 30}
    assert answer["more"] == {"explorer": False, "trainer": True, "system": False}
    # a script follows the trainer's cursor until it has every point, then polls with it
    got, since = [], 0
    while True:
        page = metrics(script, run, role="trainer", since=since, limit=3)
        got += steps(page)["trainer"]
        since = page["next_since"]["trainer"]
        if not page["more"]["trainer"]:
            break
    assert got == [1, 2, 3, 4, 5, 6, 7] and since == 7
    assert metrics(script, run, role="trainer", since=since) == {
        "run": run.pk, "name": run.name, "metrics": {}, "next_since": {}, "more": {}}  # nothing new yet


def test_without_a_limit_each_role_is_capped_at_5000(script, make_run):
    run = make_run()
    MetricPoint.objects.bulk_create(MetricPoint(run=run, role="trainer", step=step, values={"loss": 1.0})
                                    for step in range(CAP + 1))

    answer = metrics(script, run)

    assert len(answer["metrics"]["trainer"]) == CAP
    assert answer["next_since"] == {"trainer": CAP - 1} and answer["more"] == {"trainer": True}
    assert steps(metrics(script, run, since=CAP - 1)) == {"trainer": [CAP]}
    assert len(metrics(script, run, limit=10**6)["metrics"]["trainer"]) == CAP  # read as the cap


def test_keys_keep_those_metrics_and_the_points_holding_one(script, run):
    answer = metrics(script, run, keys="loss, reward/mean")

    assert steps(answer) == {"explorer": [1, 2, 3], "trainer": [1, 3, 5, 7]}
    assert answer["metrics"]["trainer"][1]["values"] == {"loss": 1 / 3} and answer["metrics"]["trainer"][1]["time"]
    assert answer["metrics"]["explorer"][0]["values"] == {"reward/mean": 0.1}
    # the limit counts the points kept: a sparse key's next page is its own points
    page = metrics(script, run, role="trainer", keys="loss", limit=2)
    assert (steps(page), page["next_since"], page["more"]) == ({"trainer": [1, 3]}, {"trainer": 3}, {"trainer": True})


@pytest.mark.parametrize("query, message", [
    ({"limit": "0"}, "limit must be a whole number from 1 to 5000"),
    ({"limit": "lots"}, "limit must be a whole number from 1 to 5000"),
    ({"since": "yesterday"}, "since must be a step number"),
    ({"role": "judge"}, "role must be one of"),
])
def test_a_bad_parameter_is_a_400_naming_it(script, run, query, message):
    answer = script.get(reverse("api-run-metrics", args=[run.pk]), query)
    assert answer.status_code == 400 and answer.json()["error"].startswith(message)
