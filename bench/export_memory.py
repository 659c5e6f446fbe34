"""Memory of a streaming export: the worker's resident memory while it exports generated experiences.

    python bench/export_memory.py [--rows 200000] [--formats jsonl parquet]

Runs in a throwaway database (<DATABASE_URL's database>_bench_export), fills it with `--rows`
experiences (responses of 16-215 tokens with action mask and logprobs, as
bench/admin_changelist.py makes them), then runs each export job the way the Celery worker does
(services.run_job), sampling this process's resident memory (RSS) every 0.1 s. Prints the RSS
as the export passes each quarter of the rows, and its peak: flat means it does not grow with
the rows exported. Figures, not pass/fail.
"""

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.admin_changelist import create_bench_database, generate_buffer

MB = 1024 * 1024


class MemorySampler(threading.Thread):
    """RSS of this process, and how far the job is, every `interval` seconds."""

    def __init__(self, job_id: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.job_id, self.interval = job_id, interval
        self.samples: list[tuple[int, int]] = []  # (rows done, RSS bytes)
        self.stopped = threading.Event()

    def run(self):
        import psutil
        from django.db import connection

        from apps.buffer.models import BufferJob

        process = psutil.Process()
        try:
            while not self.stopped.wait(self.interval):
                rows = BufferJob.objects.filter(pk=self.job_id).values_list("rows_done", flat=True).get()
                self.samples.append((rows, process.memory_info().rss))
        finally:
            connection.close()


def export_and_measure(fmt: str, total: int) -> None:
    import psutil

    from apps.buffer import services
    from apps.buffer.models import Experience

    baseline = psutil.Process().memory_info().rss
    start = time.perf_counter()
    job = services.start_export(Experience.objects.all(), fmt=fmt)
    sampler = MemorySampler(job.pk)
    sampler.start()
    job = services.run_job(job.pk)
    sampler.stopped.set()
    sampler.join()
    seconds = time.perf_counter() - start
    assert job.status == "succeeded", job.error

    size = Path(job.output.path).stat().st_size
    print(f"\n{fmt}: {job.result['exported']:,} rows in {seconds:.1f} s, file {size / MB:,.0f} MB")
    print(f"  RSS before the job: {baseline / MB:,.0f} MB")
    for quarter in (1, 2, 3, 4):
        rss = [rss for rows, rss in sampler.samples if rows <= total * quarter // 4]
        if rss:
            print(f"  RSS up to {quarter * 25:3d}% of the rows: peak {max(rss) / MB:,.0f} MB")
    peak = max(rss for _, rss in sampler.samples) if sampler.samples else baseline
    print(f"  peak RSS {peak / MB:,.0f} MB: {(peak - baseline) / MB:+,.0f} MB over the baseline")
    job.output.delete(save=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--formats", nargs="+", default=["jsonl", "parquet"])
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    os.environ["DEBUG"] = "0"  # with DEBUG on, Django records every query: not what a worker does
    os.environ.setdefault("SECRET_KEY", "bench")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    from apps.accounts.services import create_user

    setup_test_environment()
    database = create_bench_database("export")
    try:
        owner = create_user("bench-owner", "bench-password-123")
        start = time.perf_counter()
        generate_buffer(args.rows, owner, full_arrays=True)
        print(f"generated {args.rows:,} experiences in {time.perf_counter() - start:.1f} s (database {database})")
        for fmt in args.formats:
            export_and_measure(fmt, args.rows)
    finally:
        connection.close()
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
