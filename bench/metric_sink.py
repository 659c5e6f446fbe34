"""What the run's metric summaries add to a step's write: DjangoMetricSink.log of one point of 30
keys, as the trainer logs it, against the same write without them.

    python bench/metric_sink.py [--steps 1000] [--keys 30]

Runs in a throwaway database (<DATABASE_URL's database>_bench_metric_sink; SQLite when
DATABASE_URL names a SQLite file). Two runs are written step by step in turn, each step's order
flipped: one through the sink (the point, its summaries, the run's progress, the live update), the
other as the sink wrote before the summaries (the point's upsert, the progress, the live update):
taken in turn, the two share the machine's load, which on a shared machine moved a lone median
2-3x from one minute to the next. Then the last tenth of the steps are replayed on both (a resumed
run rewriting its points). Prints the median and p95 milliseconds of a step, its transaction
included. Figures, not pass/fail.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.admin_changelist import create_bench_database  # noqa: E402


def point(step: int, keys: int) -> dict:
    """A trainer point as the engine logs one: a loss that falls, the rest moving with the step."""
    values = {"loss": 1.0 / step, "kl": 0.001 * (step % 7), "model_version": step}
    values.update({f"metric_{index}": (step * (index + 1)) % 97 / 97 for index in range(keys - len(values))})
    return values


class PointOnly:
    """The sink as it was before the summaries: the point's upsert, the run's progress, the live update."""

    def __init__(self, run):
        self.run = run

    def log(self, role: str, step: int, values: dict) -> None:
        from django.db import transaction
        from django.utils import timezone

        from apps.runs import services
        from apps.runs.models import MetricPoint

        with transaction.atomic():
            now = timezone.now()
            MetricPoint.objects.bulk_create([MetricPoint(run=self.run, role=role, step=step, values=values, time=now)],
                                            update_conflicts=True, unique_fields=["run", "role", "step"],
                                            update_fields=["values", "time"])
            services.broadcast(self.run.pk, {"type": "metrics", "role": role, "step": step, "values": values})
            services.set_progress(self.run, trainer_step=step)


def time_in_turn(sinks: dict, steps, keys: int) -> dict[str, list[float]]:
    """{name: seconds of each step} of the sinks writing the same steps, in turn."""
    seconds = {name: [] for name in sinks}
    for index, step in enumerate(steps):
        for name in (list(sinks) if index % 2 == 0 else list(sinks)[::-1]):
            start = time.perf_counter()
            sinks[name].log("trainer", step, point(step, keys))
            seconds[name].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=30)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    from apps.accounts.services import create_user
    from apps.runs.live import publisher
    from apps.runs.models import Run
    from apps.runs.store import DjangoMetricSink

    setup_test_environment()
    database = create_bench_database("metric_sink")
    try:
        owner = create_user("bench-owner", "bench-password-123")
        sinks = {"with summaries": DjangoMetricSink(Run.objects.create(name="summed", owner=owner, config={})),
                 "point only": PointOnly(Run.objects.create(name="plain", owner=owner, config={}))}
        time_in_turn(sinks, range(1, 51), args.keys)  # warm: connection, statements, caches
        new = time_in_turn(sinks, range(51, args.steps + 51), args.keys)
        replayed = time_in_turn(sinks, range(args.steps + 51 - args.steps // 10, args.steps + 51), args.keys)
        print(f"{connection.vendor}, {args.keys} keys a point; ms a step, median (p95):")
        for name in sinks:
            figures = [f"{statistics.median(s) * 1000:6.2f} ({sorted(s)[int(len(s) * 0.95)] * 1000:6.2f})"
                       for s in (new[name], replayed[name])]
            print(f"  {name:15} new steps {figures[0]}   replayed steps {figures[1]}")
    finally:
        publisher.flush()  # the live updates still pending, before their database goes
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
