"""Seconds per step of the same GRPO config: headless engine vs the full stack.

    python bench/stack_overhead.py [--steps 6]

Headless: `workers.rft.loop.Loop` with in-memory stores, in this process. Full stack: the run is
launched through `runs.services.launch_run`, executed by a real Celery worker (started here) over
Postgres and Redis, with metrics stored and published live. Both time from "models loaded" to
"final checkpoint saved" (the stack: Run.started_at → Run.finished_at) and divide by the steps.
Needs the local Postgres and Redis; uses its own database `rftweb_bench` and Redis db 9.
Figures, not pass/fail.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DEBUG", "1")
os.environ["DJANGO_SETTINGS_MODULE"] = "rftweb.settings"
os.environ["DATABASE_URL"] = "postgres://postgres@localhost:5432/rftweb_bench"
os.environ["REDIS_URL"] = "redis://localhost:6379/9"

TASKSET_SPEC = "arithmetic:n=200"


def config_dict(steps: int) -> dict:
    return {
        "seed": 0,
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 8},
        "explorer": {"batch_size": 16, "max_new_tokens": 32},
        "trainer": {"lr": 1e-6, "micro_batch_size": 32, "total_steps": steps},
        "buffer": {"taskset": "bench-arithmetic"},
    }


def headless(steps: int) -> float:
    from workers.rft.config import RunConfig
    from workers.rft.loop import Loop, memory_stores

    data = config_dict(steps)
    data["buffer"]["taskset"] = TASKSET_SPEC
    config = RunConfig.from_dict(data)
    with tempfile.TemporaryDirectory() as work_dir:
        loop = Loop(config, memory_stores(config), work_dir)
        started = time.perf_counter()
        assert loop.run() == "completed"
        return (time.perf_counter() - started) / steps


def create_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS rftweb_bench WITH (FORCE)")
        conn.execute("CREATE DATABASE rftweb_bench")


def full_stack(steps: int) -> float:
    import django

    create_database()
    django.setup()
    from django.core.management import call_command

    from apps.accounts.services import create_user
    from apps.runs import services
    from apps.tasksets.models import Task, Taskset
    from workers.rft.memory import load_tasks

    call_command("migrate", verbosity=0)
    user = create_user("bench", "bench-password-1", roles=["researcher"])
    taskset = Taskset.objects.create(name="bench-arithmetic")
    Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=t.prompt, answer=t.answer, metadata=t.metadata)
        for i, t in enumerate(load_tasks(TASKSET_SPEC))
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rftweb", "worker", "-Q", "default,train", "-c", "1", "-l", "warning"],
        cwd=ROOT, start_new_session=True,
    )
    try:
        run = services.launch_run(user, "overhead", config_dict(steps))
        while not run.is_finished:
            time.sleep(1)
            run.refresh_from_db()
        assert run.status == "completed", run.error
        return (run.finished_at - run.started_at).total_seconds() / steps
    finally:
        worker.terminate()
        worker.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    steps = parser.parse_args().steps
    # Headless before and after the stack, so a change in the machine's load shows up as a spread.
    before = headless(steps)
    stack = full_stack(steps)
    after = headless(steps)
    alone = (before + after) / 2
    print(f"GRPO, tiny model, 16 tasks x 8 samples, 32 new tokens, {steps} steps (explore + train each)")
    print(f"{'headless engine':>18}: {alone:6.2f} s/step   (before {before:.2f}, after {after:.2f})")
    print(f"{'full stack':>18}: {stack:6.2f} s/step   overhead {stack - alone:+.2f} s/step ({(stack / alone - 1) * 100:+.0f}%)")


if __name__ == "__main__":
    main()
