"""The compare page's figures of each metric (comparison.metric_figures: final, best and their
steps), read from the runs' summaries, equal what the points say, however the points came to be:
written in any order, a step written again (a replayed explorer or eval step), a trainer gone back
to its checkpoint, a point deleted (summaries.forget). On Postgres and SQLite alike."""

import random

from apps.runs import comparison, services, summaries
from apps.runs.models import MetricPoint, Run

CHARTS = {"Train reward": "explorer/reward_mean", "Train loss": "trainer/loss", "Held-out": "eval/accuracy",
          "Throughput": "trainer/tokens_per_s"}


def from_points(run: Run) -> dict[str, tuple]:
    """{title: (chart, final, final step, best, best step)} as the points say, of the first
    candidate chart (comparison.SUMMARY_METRICS) that any point holds a number of: the final is
    the number at the highest step that has one, the best the lowest or highest, at the first step
    that reached it."""
    found = {}
    for title, candidates in comparison.SUMMARY_METRICS:
        for chart, _ in candidates:
            role, key = chart.split("/", 1)
            series = [(step, summaries.numbers(values).get(key)) for step, values in
                      MetricPoint.objects.filter(run=run, role=role).order_by("step").values_list("step", "values")]
            series = [(step, value) for step, value in series if value is not None]
            if series:
                pick = min if comparison.metric_direction(chart) == "min" else max
                best = pick(value for _, value in series)
                found[title] = (chart, series[-1][1], series[-1][0], best,
                                next(step for step, value in series if value == best))
                break
    return found


def shown(run: Run) -> dict[str, tuple]:
    [summary] = comparison.run_summaries([run])
    return {title: (m.chart, m.final, m.final_step, m.best, m.best_step) for title, m in summary.metrics.items()}


def test_the_figures_follow_the_points_through_replays_rewinds_and_deletions(make_run):
    run = make_run("r", status=Run.Status.RUNNING)
    chance = random.Random(7)
    for step in range(1, 31):
        services.record_metrics(run, "explorer", step, {"reward_mean": round(chance.random(), 3)})
        services.record_metrics(run, "trainer", step, {"loss": round(chance.uniform(0.1, 2), 3),
                                                       "tokens_per_s": chance.choice([900.0, 1000.0, 1100.0])})
        if step % 5 == 0:
            services.record_metrics(run, "eval", step, {"accuracy": chance.choice([0.25, 0.5, 0.75])})
    assert shown(run) == from_points(run) and set(shown(run)) == set(CHARTS)

    best_reward_step = from_points(run)["Train reward"][4]
    services.record_metrics(run, "explorer", best_reward_step, {"reward_mean": -1.0})  # replayed lower
    services.record_metrics(run, "explorer", 3, {"reward_mean": 5.0})  # replayed, now the best
    services.record_metrics(run, "eval", 10, {"accuracy": 0.75})  # a tie with an earlier best, or the first
    services.record_metrics(run, "explorer", 30, {"seconds": 1.0})  # the latest step without the key
    assert shown(run) == from_points(run)
    assert shown(run)["Train reward"][1:] == (from_points(run)["Train reward"][1], 29, 5.0, 3)

    summaries.forget(MetricPoint.objects.filter(run=run, role="trainer", step__gt=20))  # back to its checkpoint
    assert shown(run) == from_points(run) and shown(run)["Train loss"][2] == 20
    services.record_metrics(run, "trainer", 21, {"loss": 0.01, "tokens_per_s": 5.0})  # written again as new
    assert shown(run) == from_points(run)

    summaries.forget(MetricPoint.objects.filter(run=run, role="explorer", step=3))  # the best point deleted
    summaries.forget(MetricPoint.objects.filter(run=run, role="trainer", step=21))  # the lowest loss deleted
    assert shown(run) == from_points(run)
    summaries.forget(MetricPoint.objects.filter(run=run, role="eval"))  # never evaluated, after all
    assert "Held-out" not in shown(run) and shown(run) == from_points(run)


def test_a_diverged_or_nested_value_counts_as_the_points_hold_it(make_run):
    """A diverged loss is stored as null and counts for nothing; a nested reward is
    explorer/reward/mean, the first of the reward candidates (queries.REWARD_KEYS)."""
    run = make_run("r", status=Run.Status.RUNNING)
    for step, (loss, reward) in enumerate(((1.0, 0.2), (0.5, 0.7), (float("nan"), 0.4)), start=1):
        services.record_metrics(run, "trainer", step, {"loss": loss})
        services.record_metrics(run, "explorer", step, {"reward": {"mean": reward}, "reward_mean": 9.0})
    figures = shown(run)
    assert figures["Train loss"] == ("trainer/loss", 0.5, 2, 0.5, 2)
    assert figures["Train reward"] == ("explorer/reward/mean", 0.4, 3, 0.7, 2)


def test_runs_that_record_different_candidates_each_show_their_first(make_run, django_assert_max_num_queries):
    """A run of each candidate of the train reward, and one that only trains (its loss stands in):
    one query for which each records, then one per chart shown (and the token counts' as ever)."""
    runs = [make_run(name, status=Run.Status.RUNNING) for name in ("explores", "trains", "sft")]
    for step in (1, 2):
        services.record_metrics(runs[0], "explorer", step, {"reward_mean": step / 4})
        services.record_metrics(runs[1], "trainer", step, {"reward": step / 2, "loss": 1.0})
        services.record_metrics(runs[2], "trainer", step, {"loss": 2.0 / step})
    with django_assert_max_num_queries(5 + 4 + 3):  # token keys, counts, wall time; figures; 3 charts
        summaries_ = comparison.run_summaries(runs)
    assert [s.metrics["Train reward"].chart if "Train reward" in s.metrics else None for s in summaries_] == [
        "explorer/reward_mean", "trainer/reward", None]
    assert [s.metrics["Train loss"].best if "Train loss" in s.metrics else None for s in summaries_] == [None, 1.0, 1.0]
    for run in runs:
        assert shown(run) == from_points(run)
