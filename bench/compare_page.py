"""The compare page's metric figures (each run's final and best of its reward, loss, held-out and
throughput) read from the points, as comparison read them before the summaries, and from the runs'
summaries, as it reads them now: server time and queries side by side, and the same figures.

    python bench/compare_page.py [--runs 4,8] [--steps 2000] [--repeat 5]

Runs in a throwaway database of DATABASE_URL's kind (<its name>_bench_compare_page: Postgres, or
the embedded demo's SQLite), fills it with the most runs asked for, of `--steps` explorer and
trainer steps each and an eval point every 50 (rewards that rise and losses that fall with the
step: the best is near the end, the step of the best the furthest to look for), and their
summaries; then times, for the first N runs of each count, the figures alone and the whole page,
before and after in turn on the same data. Figures, not pass/fail: they depend on the machine
and its load.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.admin_changelist import create_bench_database  # noqa: E402


def generate(count: int, steps: int, owner) -> list:
    """`count` runs of `steps` explorer and trainer points (an eval point every 50 steps), written
    the same on either database, and their summaries (summaries.rebuild, as the migration)."""
    from apps.runs.models import MetricPoint, MetricSummary, Run
    from apps.runs.summaries import rebuild

    chance = random.Random(0)
    runs = Run.objects.bulk_create([Run(name=f"bench-{index}", owner=owner, config={"trainer": {"total_steps": steps}},
                                        status=Run.Status.COMPLETED, explorer_step=steps, trainer_step=steps)
                                    for index in range(count)])
    for index, run in enumerate(runs):
        points = []
        for step in range(1, steps + 1):
            points.append(MetricPoint(run=run, role="explorer", step=step, values={
                "reward_mean": min(1.0, step / steps * (0.3 + index / 10) + chance.random() * 0.05),
                "response_length": 40 + step % 17, "rollouts": 64, "seconds": 2.5 + chance.random(),
                "tokens_per_s": 900 + chance.random() * 10}))
            points.append(MetricPoint(run=run, role="trainer", step=step, values={
                "loss": 1 / (1 + step * (index + 1) / 100) + chance.random() * 0.01, "kl": chance.random() * 0.01,
                "tokens_per_s": 3000 + chance.random() * 50, "seconds": 1 + chance.random()}))
            if step % 50 == 0:
                points.append(MetricPoint(run=run, role="eval", step=step, values={
                    "accuracy": round(chance.random(), 2), "response_length": 30.0, "rollouts": 32}))
        MetricPoint.objects.bulk_create(points, batch_size=2000)
    rebuild(MetricPoint, MetricSummary, [run.pk for run in runs])
    return runs


def figures_from_points(runs, keys) -> dict:
    """The figures as comparison read them before the summaries (its _metric_summaries, kept here
    to measure): a query per chart whose final and best, and the steps of each, are subqueries
    over the run's points of the role, the best sorting every one of them."""
    from django.db.models import OuterRef, Subquery

    from apps.runs import comparison
    from apps.runs.models import MetricPoint, Run

    figures = {}
    for title, candidates in comparison.SUMMARY_METRICS:
        picked = {}
        for run in runs:
            found = next(((chart, label) for chart, label in candidates if chart in keys[run.pk]), None)
            if found:
                picked.setdefault((*found, tuple(keys[run.pk][found[0]])), []).append(run.pk)
        for (chart, label, path), ids in picked.items():
            direction = comparison.metric_direction(chart)
            points = comparison._number_at(MetricPoint.objects.filter(run=OuterRef("pk"), role=chart.split("/")[0]),
                                           list(path))
            final = points.order_by("-step")
            best = points.order_by("v" if direction == "min" else "-v", "step")
            found = Run.objects.filter(pk__in=ids).annotate(
                final=Subquery(final.values("v")[:1]), final_step=Subquery(final.values("step")[:1]),
                best=Subquery(best.values("v")[:1]), best_step=Subquery(best.values("step")[:1]),
            ).values_list("pk", "final", "final_step", "best", "best_step")
            for pk, *numbers in found:
                if numbers[0] is not None:
                    figures.setdefault(title, {})[pk] = comparison.MetricFigures(label, chart, direction, *numbers)
    return figures


class ReadingPoints:
    """Within it the compare page reads its figures from the points, with the chart keys it read
    for the token counts (as it did: one read of them a page)."""

    def __enter__(self):
        from apps.runs import comparison

        self.chart_keys, self.metric_figures, kept = comparison.chart_keys, comparison.metric_figures, {}

        def chart_keys(runs):
            kept["keys"] = self.chart_keys(runs)
            return kept["keys"]

        comparison.chart_keys = chart_keys
        comparison.metric_figures = lambda runs: figures_from_points(runs, kept.pop("keys"))

    def __exit__(self, *exc):
        from apps.runs import comparison

        comparison.chart_keys, comparison.metric_figures = self.chart_keys, self.metric_figures


def timed(call, repeat: int) -> tuple[float, int]:
    """(median seconds, queries) of call()."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seconds = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), len(captured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="4,8", help="the counts of runs compared, comma-separated")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    counts = [int(count) for count in args.runs.split(",")]

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    from apps.accounts.roles import RESEARCHER
    from apps.accounts.services import create_user
    from apps.runs import comparison

    setup_test_environment()
    database = create_bench_database("compare_page")
    try:
        researcher = create_user("bench-researcher", "bench-password-123", roles=[RESEARCHER])
        start = time.perf_counter()
        runs = generate(max(counts), args.steps, researcher)
        print(f"{connection.vendor}: {max(counts)} runs of {args.steps} steps and their summaries made in "
              f"{time.perf_counter() - start:.1f} s (database {database})")
        client = Client()
        client.force_login(researcher)
        print(f"{'runs compared':14} {'what':22} {'before: points ms':>18} {'queries':>8} {'after: summaries ms':>20} "
              f"{'queries':>8}")
        for count in counts:
            picked = runs[:count]
            url = reverse("run-compare") + "?" + "&".join(f"runs={run.pk}" for run in picked)
            before = figures_from_points(picked, comparison.chart_keys(picked))
            assert before == comparison.metric_figures(picked), "the figures differ"
            client.get(url)  # warm: templates and the session
            cases = {
                "metric figures": (lambda runs=picked: figures_from_points(runs, comparison.chart_keys(runs)),
                                   lambda runs=picked: comparison.metric_figures(runs)),
                "the compare page": (lambda url=url: client.get(url), lambda url=url: client.get(url)),
            }
            for what, (old, new) in cases.items():
                rounds = [], []  # before and after in turn, each round the same load on both
                for _ in range(args.repeat):
                    with ReadingPoints():
                        rounds[0].append(timed(old, 1))
                    rounds[1].append(timed(new, 1))
                (was, was_queries), (now, now_queries) = (
                    (statistics.median(seconds for seconds, _ in side), side[-1][1]) for side in rounds)
                print(f"{count:14d} {what:22} {was * 1000:18.0f} {was_queries:8d} {now * 1000:20.0f} {now_queries:8d}")
        print("the figures shown, from the points and from the summaries: the same")
    finally:
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
