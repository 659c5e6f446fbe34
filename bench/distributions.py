"""Server time and queries of the run page's Distributions panel (apps/runs/distributions.py) on a
run of generated rollouts.

    python bench/distributions.py [--steps 1000] [--rollouts 128] [--repeat 5]

Runs in a throwaway database beside DATABASE_URL's (Postgres, or SQLite: the embedded demo's), fills
it with `--steps` explorer steps of `--rollouts` rollouts (rewards in [0, 1], responses of 16-215
tokens), then times run_distributions on it. Figures, not pass/fail: they depend on the machine and
its load.
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

BATCH = 4_000


def generate_rollouts(run, steps: int, rollouts: int) -> None:
    from apps.buffer.models import Experience

    rng = random.Random(0)
    rows = []
    for step in range(steps):
        for index in range(rollouts):
            length = rng.randint(16, 215)
            rows.append(Experience(run=run, source="rollout", explorer_step=step, group_id=f"{step}-{index // 8}",
                                   rollout_index=index % 8, reward=rng.random(), prompt_ids=[1] * 24,
                                   response_ids=[42] * length, action_mask=[1] * length))
            if len(rows) == BATCH:
                Experience.objects.bulk_create(rows)
                rows.clear()
    Experience.objects.bulk_create(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from apps.runs.distributions import run_distributions
    from apps.runs.models import Run

    setup_test_environment()
    database = create_bench_database("distributions")
    try:
        owner = get_user_model().objects.create(username="bench")
        run = Run.objects.create(name="bench", owner=owner, config={}, status=Run.Status.RUNNING)
        start = time.perf_counter()
        generate_rollouts(run, args.steps, args.rollouts)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE buffer_experience")
        print(f"generated {args.steps * args.rollouts:,} rollouts in {time.perf_counter() - start:.1f} s "
              f"({connection.vendor}, database {database})")
        run_distributions(run)  # warm: the first read also fills the page cache
        times = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                run_distributions(run)
                times.append(time.perf_counter() - started)
        print(f"run_distributions: {statistics.median(times):.3f} s (median of {args.repeat}; "
              f"min {min(times):.3f}), {len(captured)} queries")
    finally:
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
