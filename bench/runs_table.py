"""Server time and queries of the runs list sorted by each kind of column, on generated runs.

    python bench/runs_table.py [--runs 200] [--steps 2000]

Runs in a throwaway Postgres database (<DATABASE_URL's database>_bench_runs_table), fills it with
`--runs` runs of `--steps` explorer and trainer steps each (and an eval point every 50 steps) and
their metric summaries (timed: what the data migration 0020 takes for as many points), then times
a page of the list (50 runs, with the default columns and two metric summaries) sorted by each
case, the list grouped by config keys (?group=), and the CSVs of them all. Figures, not
pass/fail: they depend on the machine and its load. The slow test in
tests/apps/runs/test_run_table_scale.py uses the same generator.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.admin_changelist import create_bench_database  # noqa: E402

# A point's values as the engine logs them (workers/rft): a dozen keys a role, numbers that move
# with the step and differ between runs (so that the sorts have something to order).
GENERATE_SQL = """
INSERT INTO runs_metricpoint (run_id, role, step, values, time)
SELECT run_id, 'explorer', s, jsonb_build_object(
    'reward_mean', least(1.0, (s::float / %(steps)s) * (0.3 + (run_id %% 7) / 10.0) + random() * 0.05),
    'reward_std', 0.2 + random() * 0.1, 'response_length', 40 + (s %% 17), 'rollouts', 64,
    'seconds', 2.5 + random(), 'tokens_per_s', 900 + (run_id %% 50) * 3 + random() * 10,
    'model_version', s, 'accuracy', random(), 'format', 0.9, 'staleness', s %% 2, 'groups', 8,
    'zero_std_groups', s %% 3), now()
FROM unnest(%(runs)s::bigint[]) AS run_id CROSS JOIN generate_series(1, %(steps)s) AS s;
INSERT INTO runs_metricpoint (run_id, role, step, values, time)
SELECT run_id, 'trainer', s, jsonb_build_object(
    'loss', 1.0 / (1 + s * (run_id %% 5 + 1) / 100.0) + random() * 0.01, 'kl', random() * 0.01,
    'entropy', 1.5 - s::float / %(steps)s, 'grad_norm', random(), 'lr', 1e-5, 'pg_clipfrac', random() * 0.1,
    'tokens_per_s', 3000 + random() * 50, 'seconds', 1.0 + random(), 'samples', 64, 'tokens', 6000,
    'advantage_mean', 0.0, 'ratio_max', 1.2), now()
FROM unnest(%(runs)s::bigint[]) AS run_id CROSS JOIN generate_series(1, %(steps)s) AS s;
INSERT INTO runs_metricpoint (run_id, role, step, values, time)
SELECT run_id, 'eval', s, jsonb_build_object('accuracy', random(), 'reward_mean', random(), 'rollouts', 32), now()
FROM unnest(%(runs)s::bigint[]) AS run_id CROSS JOIN generate_series(0, %(steps)s, 50) AS s;
"""
LRS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4)
ALGORITHMS = ("grpo", "rloo", "opmd", "sft")


def generate_runs(count: int, steps: int, owner) -> list:
    """`count` runs owned by `owner`, with full configs (lr, algorithm, ... varying), `steps`
    explorer and trainer points each and their summaries; the tables vacuumed and analysed."""
    runs = generate_points(count, steps, owner)
    summarize(runs)
    return runs


def generate_points(count: int, steps: int, owner) -> list:
    """The runs and their points, written in SQL (no summaries yet)."""
    from django.db import connection

    from apps.runs.models import Run
    from workers.rft.config import RunConfig

    runs = []
    for index in range(count):
        config = RunConfig().to_dict()
        config["trainer"]["lr"] = LRS[index % len(LRS)]
        config["trainer"]["total_steps"] = steps
        config["algorithm"]["name"] = ALGORITHMS[index % len(ALGORITHMS)]
        runs.append(Run(name=f"bench-{index:03d}", owner=owner, config=config, status=Run.Status.COMPLETED,
                        explorer_step=steps, trainer_step=steps))
    runs = Run.objects.bulk_create(runs)
    with connection.cursor() as cursor:
        cursor.execute(GENERATE_SQL, {"runs": [run.pk for run in runs], "steps": steps})
        cursor.execute("VACUUM ANALYZE runs_metricpoint")  # as autovacuum would leave a live table
        cursor.execute("VACUUM ANALYZE runs_run")
    return runs


def summarize(runs) -> float:
    """The runs' metric summaries made from their points, as the data migration makes them for the
    runs there are (apps/runs/summaries.rebuild); returns the seconds it took."""
    from django.db import connection

    from apps.runs.models import MetricPoint, MetricSummary
    from apps.runs.summaries import rebuild

    start = time.perf_counter()
    rebuild(MetricPoint, MetricSummary, [run.pk for run in runs])
    seconds = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE runs_metricsummary")
    return seconds


COLUMNS = "status,progress,reward,algorithm.name,trainer.lr,explorer/reward_mean,best:trainer/loss,owner,created"


def list_cases() -> dict[str, str]:
    """The list URLs timed: a page of 50 sorted by each kind of column, and the CSV of every run."""
    base = f"/runs/?cols={COLUMNS}"
    return {
        "newest first (the default)": base,
        "config number (trainer.lr)": f"{base}&sort=trainer.lr",
        "config text (algorithm.name), descending": f"{base}&sort=-algorithm.name",
        "latest metric (explorer/reward_mean)": f"{base}&sort=-explorer/reward_mean",
        "best metric (best:explorer/reward_mean)": f"{base}&sort=-best:explorer/reward_mean",
        "best loss (best:trainer/loss), page 3": f"{base}&sort=best:trainer/loss&page=3",
        "reward, filtered by lr and reward": f"{base}&sort=-reward&where=trainer.lr%3D1e-5&where=reward%3E%3D0.2",
        "CSV of every run, sorted by best reward": f"/runs/list.csv?cols={COLUMNS}&sort=-best:explorer/reward_mean",
        "grouped by algorithm.name, by best reward": f"{base}&group=algorithm.name&sort=-best:explorer/reward_mean",
        "grouped by algorithm.name,trainer.lr, one open": (
            f"{base}&group=algorithm.name,trainer.lr&expand=%5B%22grpo%22%2C1e-05%5D"),
        "CSV of the groups by algorithm.name": f"/runs/list.csv?cols={COLUMNS}&group=algorithm.name",
    }


def time_list(client, url: str, repeat: int) -> tuple[float, int, int]:
    """(median server seconds, queries, status) of GET url, a streamed answer (the CSV) read whole."""
    import statistics

    from asgiref.sync import async_to_sync
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    async def read(response):
        return [chunk async for chunk in response.streaming_content]

    seconds, queries, status = [], 0, None
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            response = client.get(url)
            if response.streaming:
                async_to_sync(read)(response)
            seconds.append(time.perf_counter() - start)
        queries, status = len(captured), response.status_code
    return statistics.median(seconds), queries, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from apps.accounts.roles import RESEARCHER
    from apps.accounts.services import create_user

    setup_test_environment()
    database = create_bench_database("runs_table")
    try:
        researcher = create_user("bench-researcher", "bench-password-123", roles=[RESEARCHER])
        start = time.perf_counter()
        runs = generate_points(args.runs, args.steps, researcher)
        points = args.runs * (2 * args.steps + args.steps // 50 + 1)
        print(f"generated {args.runs} runs, {points:,} metric points in {time.perf_counter() - start:.1f} s "
              f"(database {database}); their summaries made from them in {summarize(runs):.1f} s")
        client = Client()
        client.force_login(researcher)
        print(f"{'runs list':48} {'server ms (median)':>18} {'queries':>8}")
        for name, url in list_cases().items():
            client.get(url)  # warm: the first request also loads templates and the session
            seconds, queries, status = time_list(client, url, args.repeat)
            assert status == 200, (url, status)
            print(f"{name:48} {seconds * 1000:18.0f} {queries:8d}")
    finally:
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
