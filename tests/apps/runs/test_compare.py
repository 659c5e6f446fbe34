"""Compare (config diff, summary) and the metric downloads (CSV, JSON), over real Postgres."""

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.runs import comparison, services
from apps.runs.api import token_for
from apps.runs.models import MetricPoint, Run

Status = Run.Status


def body(response) -> str:
    """A streamed download read as the ASGI server reads it (the chunks are an async iterator)."""

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def point(run, role, step, values):
    """As the engine writes a point: with the run's summaries of it, which the compare page reads."""
    return services.record_metrics(run, role, step, values)


def at(run, seconds: int):
    """Set the times of the run's points (recorded when created): `seconds` a step after a fixed start."""
    start = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for p in run.metrics.all():
        p.time = start + timedelta(seconds=p.step * seconds)
        p.save(update_fields=["time"])


# ---- config diff -------------------------------------------------------------------------------


def test_flatten_config_joins_nested_keys_and_indexes_lists_of_mappings():
    config = {"a": {"b": 1, "c": {"d": "x"}}, "tags": [1, 2], "pipes": [{"name": "f"}, {"name": "g", "k": 3}],
              "empty": {}}
    assert comparison.flatten_config(config) == {
        "a.b": 1, "a.c.d": "x", "tags": [1, 2], "pipes[0].name": "f", "pipes[1].name": "g", "pipes[1].k": 3,
        "empty": {},
    }


def test_config_diff_keeps_only_the_keys_that_differ_with_missing_ones_as_none(make_run):
    a = make_run("a", config={"trainer": {"lr": 0.001, "total_steps": 100}, "seed": 1, "list": [1, 2],
                              "flag": True, "pipes": [{"name": "f"}]})
    b = make_run("b", config={"trainer": {"lr": 0.0003, "total_steps": 100}, "seed": 1, "list": [1, 3],
                              "flag": 1, "pipes": [{"name": "f"}, {"name": "g"}]})
    c = make_run("c", config={"trainer": {"lr": 0.001, "total_steps": 100}, "seed": 1, "list": [1, 2],
                              "flag": True, "pipes": [{"name": "f"}], "extra": {"x": "y"}})
    diff = dict(comparison.config_diff([a, b, c]))
    assert diff == {
        "trainer.lr": ["0.001", "0.0003", "0.001"],
        "list": ["[1, 2]", "[1, 3]", "[1, 2]"],
        "flag": ["true", "1", "true"],  # equal in Python, not in the config
        "pipes[1].name": [None, "g", None],
        "extra.x": [None, None, "y"],
    }
    assert comparison.config_diff([a, a]) == []


def test_the_compare_page_shows_the_diff_and_the_summary(researcher_client, make_run):
    a = make_run("alpha", status=Status.COMPLETED, trainer_step=100, config={"trainer": {"total_steps": 100, "lr": 1}})
    b = make_run("beta", status=Status.RUNNING, trainer_step=40, config={"trainer": {"total_steps": 100, "lr": 2}})
    html = researcher_client.get(reverse("run-compare"), {"runs": [a.pk, b.pk]}).content.decode()
    assert "trainer.lr" in html and "trainer.total_steps" not in html
    assert "100 / 100" in html and "40 / 100" in html
    assert f'href="{reverse("compare-metrics-csv")}?runs={a.pk}&amp;runs={b.pk}"' in html
    assert f'href="{reverse("run-metrics-csv", args=[a.pk])}"' in html


def test_one_run_picked_asks_for_another_to_diff(researcher_client, make_run):
    html = researcher_client.get(reverse("run-compare"), {"runs": [make_run("solo").pk]}).content.decode()
    assert "Pick another run to see where their configs differ" in html and 'id="compare-summary"' in html


def test_the_picker_finds_runs_older_than_the_newest_50(researcher_client, make_run):
    """It listed the newest 50 runs and nothing else: an older run could not be picked."""
    oldest = make_run("baseline from march")
    newer = [make_run(f"run {index}") for index in range(50)]
    url = reverse("run-compare")
    page = researcher_client.get(url, {"runs": newer[0].pk})
    assert oldest not in page.context["choices"] and "find older ones" in page.content.decode()
    for search in ("MARCH", f"#{oldest.pk}"):
        found = researcher_client.get(url, {"runs": newer[0].pk, "q": search}).context
        assert found["choices"] == [newer[0], oldest], search  # the picked run stays, ticked, first
    # A bare number: the run of that id, and those whose names hold it.
    assert oldest in researcher_client.get(url, {"q": str(oldest.pk)}).context["choices"]
    nothing = researcher_client.get(url, {"q": "no such run"}).content.decode()
    assert "No run matches “no such run”" in nothing


# ---- summary -----------------------------------------------------------------------------------


def test_direction_lower_is_better_for_loss_kl_and_time_higher_for_the_rest():
    assert [comparison.metric_direction(chart) for chart in (
        "trainer/loss", "trainer/sft_loss", "trainer/kl", "trainer/seconds", "explorer/reward_mean",
        "eval/exact_match", "trainer/tokens_per_s", "trainer/approx_kl",
    )] == ["min", "min", "min", "min", "max", "max", "max", "min"]


def test_summary_final_and_best_follow_each_metrics_direction(make_run):
    run = make_run("r", status=Status.COMPLETED, trainer_step=3, config={"trainer": {"total_steps": 3}})
    rewards, losses = [0.2, 0.9, 0.5], [2.0, 0.7, 1.1]
    for step, (reward, loss) in enumerate(zip(rewards, losses), start=1):
        point(run, "explorer", step, {"reward_mean": reward, "tokens_per_s": 100.0})
        point(run, "trainer", step, {"loss": loss, "reward_mean": reward, "tokens_per_s": 1000.0, "seconds": 2.0})
        point(run, "eval", step, {"exact_match": step / 10})
    point(run, "trainer", 4, {"loss": None, "tokens_per_s": 1000.0, "seconds": 2.0})  # diverged: not a number
    [summary] = comparison.run_summaries([run])
    reward, loss = summary.metrics["Train reward"], summary.metrics["Train loss"]
    assert (reward.chart, reward.final, reward.best, reward.best_step) == ("explorer/reward_mean", 0.5, 0.9, 2)
    assert (loss.direction, loss.final, loss.final_step, loss.best, loss.best_step) == ("min", 1.1, 3, 0.7, 2)
    held_out = summary.metrics["Held-out"]
    assert (held_out.label, held_out.final, held_out.best) == ("Held-out accuracy", 0.3, 0.3)
    assert summary.metrics["Throughput"].chart == "trainer/tokens_per_s"
    assert summary.tokens_trained == 4 * 1000 * 2.0  # rate × seconds over the trainer's steps
    rows = {row["label"]: [cell.get("text") for cell in row["cells"]] for row in comparison.summary_rows([summary])}
    assert rows["Train loss, best (lowest)"] == ["0.7"] and rows["Train reward, best (highest)"] == ["0.9"]
    assert rows["Tokens trained (prompt + response)"] == ["8,000"]


def test_tokens_generated_are_the_response_tokens_of_the_rollouts_and_evals(make_run):
    """The explorer's tokens_per_s is over its generation time, its `seconds` the whole step (the
    pipeline and the buffer write too): rate × seconds counted 41,183 tokens of a run that
    generated 24,014 (workers/rft/explorer.py, Explorer._roll_out and rollout_metrics)."""
    explorer = make_run("explores", config={"mode": "explore", "trainer": {"total_steps": 2}})
    for step, (length, rollouts) in enumerate(((10.0, 8), (20.5, 8)), start=1):
        generated = length * rollouts
        point(explorer, "explorer", step, {"response_length": length, "rollouts": rollouts,
                                           "tokens_per_s": generated / 0.5, "seconds": 0.9})
    bench = make_run("bench", config={"mode": "bench"})
    point(bench, "eval", 0, {"response_length": 4.0, "rollouts": 50, "exact_match": 0.1})
    point(bench, "eval", 1, {"response_length": 3.0, "rollouts": 50, "exact_match": 0.3})
    summaries = comparison.run_summaries([explorer, bench])
    assert [(s.tokens_generated, s.tokens_trained) for s in summaries] == [(10 * 8 + 20.5 * 8, None), (350.0, None)]
    rows = {row["label"]: [cell.get("text") for cell in row["cells"]] for row in comparison.summary_rows(summaries)}
    assert rows["Tokens generated (responses)"] == ["244", "350"]
    assert "Tokens trained (prompt + response)" not in rows  # neither trains


def test_summaries_take_as_many_queries_for_six_runs_as_for_one(make_run, django_assert_max_num_queries):
    """Read a run at a time, a summary took 17 queries a run (a sweep page of 6 runs: 106)."""
    runs = []
    for index in range(6):
        run = make_run(f"r{index}", status=Status.COMPLETED, trainer_step=2)
        for step in (1, 2):
            point(run, "explorer", step, {"reward_mean": index / 10 + step, "response_length": 5.0, "rollouts": 4})
            point(run, "trainer", step, {"loss": 1.0 / step, "tokens_per_s": 10.0, "seconds": 1.0})
            point(run, "eval", step, {"exact_match": step / 4})
        runs.append(run)
    with django_assert_max_num_queries(20) as one:
        comparison.run_summaries(runs[:1])
    with django_assert_max_num_queries(len(one.captured_queries)):
        summaries = comparison.run_summaries(runs)
    assert [s.metrics["Train reward"].final for s in summaries] == [index / 10 + 2 for index in range(6)]
    assert {s.tokens_generated for s in summaries} == {40.0} and {s.tokens_trained for s in summaries} == {20.0}


def test_summary_of_runs_with_different_metrics_leaves_blanks(make_run):
    trained = make_run("t", config={"trainer": {"total_steps": 10}})
    point(trained, "trainer", 1, {"loss": 1.5})
    empty = make_run("e")
    now = timezone.now()
    empty.started_at, empty.finished_at = now - timedelta(minutes=62, seconds=5), now
    rows = comparison.summary_rows(comparison.run_summaries([trained, empty]))
    rows = {row["label"]: [cell.get("text") for cell in row["cells"]] for row in rows}
    assert rows["Train loss, final"] == ["1.5", None]
    assert rows["Wall time"] == ["0 s", "1 h 02 min"]  # one point, never started: no time passed
    assert not [label for label in rows if label.startswith("Tokens")] and "Held-out, final" not in rows


def test_wall_time_of_a_run_never_started_is_its_metrics_span(make_run):
    run = make_run("r")
    point(run, "explorer", 1, {"reward_mean": 0.1})
    point(run, "explorer", 5, {"reward_mean": 0.1})
    at(run, 30)
    assert comparison.duration(comparison.run_summaries([run])[0].wall_seconds) == "2 min 00 s"


# ---- downloads ---------------------------------------------------------------------------------


@pytest.fixture
def measured(make_run):
    run = make_run("=cmd|' /C calc'!A0", status=Status.COMPLETED)  # a spreadsheet formula for a name
    point(run, "explorer", 1, {"reward_mean": 0.25, "reward": {"exact_match": 1.0}, "ok": True})
    point(run, "trainer", 1, {"loss": 1.5})
    point(run, "trainer", 2, {"loss": None})
    at(run, 60)
    return run


def test_metrics_csv_is_long_format_with_times_and_safe_text(researcher_client, measured):
    response = researcher_client.get(reverse("run-metrics-csv", args=[measured.pk]))
    assert response.status_code == 200 and response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="cmd-c-calca0-{measured.pk}-metrics.csv"'
    rows = list(csv.reader(io.StringIO(body(response))))
    name = "'=cmd|' /C calc'!A0"  # quoted: a spreadsheet shows it, never runs it
    assert rows[0] == ["run", "name", "step", "key", "value", "time"]
    # By role and step; a point's keys in Postgres's order (jsonb keeps them sorted its own way).
    assert sorted(rows[1:4]) + rows[4:] == [
        [str(measured.pk), name, "1", "explorer/ok", "1", "2026-01-02T03:05:05+00:00"],
        [str(measured.pk), name, "1", "explorer/reward/exact_match", "1.0", "2026-01-02T03:05:05+00:00"],
        [str(measured.pk), name, "1", "explorer/reward_mean", "0.25", "2026-01-02T03:05:05+00:00"],
        [str(measured.pk), name, "1", "trainer/loss", "1.5", "2026-01-02T03:05:05+00:00"],
        [str(measured.pk), name, "2", "trainer/loss", "", "2026-01-02T03:06:05+00:00"],
    ]


def test_metrics_json_has_every_point_by_role(researcher_client, measured):
    response = researcher_client.get(reverse("run-metrics-json", args=[measured.pk]))
    assert response["Content-Type"] == "application/json" and "attachment" in response["Content-Disposition"]
    data = json.loads(body(response))
    assert data["run"] == measured.pk and data["name"] == measured.name
    assert data["metrics"]["trainer"] == [
        {"step": 1, "time": "2026-01-02T03:05:05+00:00", "values": {"loss": 1.5}},
        {"step": 2, "time": "2026-01-02T03:06:05+00:00", "values": {"loss": None}},
    ]
    assert list(data["metrics"]) == ["explorer", "trainer"]


def test_the_json_of_a_run_without_metrics_is_valid(researcher_client, make_run):
    run = make_run("empty")
    data = json.loads(body(researcher_client.get(reverse("run-metrics-json", args=[run.pk]))))
    assert data == {"run": run.pk, "name": "empty", "metrics": {}}


def test_a_long_download_comes_in_chunks(researcher_client, make_run):
    run = make_run("long")
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, role="trainer", step=step, values={"loss": 1.0, "kl": 0.01, "entropy": 2.0})
        for step in range(3000)
    )
    response = researcher_client.get(reverse("run-metrics-csv", args=[run.pk]))

    async def chunks():
        return [chunk async for chunk in response.streaming_content]

    parts = async_to_sync(chunks)()
    assert len(parts) > 1
    assert b"".join(parts).decode().count("\n") == 1 + 3 * 3000


def test_compare_downloads_hold_the_runs_in_the_order_picked(researcher_client, make_run):
    a, b = make_run("a"), make_run("b")
    point(a, "trainer", 1, {"loss": 1.0})
    point(b, "trainer", 1, {"loss": 2.0})
    query = {"runs": [b.pk, a.pk, b.pk, "999"]}
    response = researcher_client.get(reverse("compare-metrics-csv"), query)
    assert response["Content-Disposition"] == f'attachment; filename="runs-{b.pk}-{a.pk}-metrics.csv"'
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [(row["name"], row["value"]) for row in rows] == [("b", "2.0"), ("a", "1.0")]
    data = json.loads(body(researcher_client.get(reverse("compare-metrics-json"), query)))
    assert [run["name"] for run in data["runs"]] == ["b", "a"]


def test_a_compare_download_without_runs_says_what_is_missing(researcher_client, make_run):
    response = researcher_client.get(reverse("compare-metrics-csv"), {"runs": ["", "999"]}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("run-compare")
    assert "no run was given" in response.content.decode()


@pytest.mark.parametrize(("sent", "named"), [
    ("99999999999999999999", "runs=99999999999999999999 is too large for an id: ids go up to 9223372036854775807"),
    ("x", "runs='x' is not an id: an id is a whole number"),
])
def test_a_compare_download_names_a_value_that_is_no_id(researcher_client, researcher, make_run, sent, named):
    """An id past a bigint was dropped as if absent: the answer said "no run was given"."""
    run = make_run("a")
    for name in ("compare-metrics-csv", "compare-metrics-json"):
        response = researcher_client.get(reverse(name), {"runs": [run.pk, sent]})
        assert (response.status_code, response.content.decode()) == (400, f"Bad request: {named}")
    script = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    response = script.get(reverse("compare-metrics-json"), {"runs": sent})
    assert response.status_code == 400 and response.json() == {"error": named}


def test_downloads_of_a_missing_run_are_404(researcher_client):
    assert researcher_client.get(reverse("run-metrics-csv", args=[999])).status_code == 404
