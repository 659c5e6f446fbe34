"""Orchestration overhead: the same GRPO config (tiny model, 16 tasks x 8 samples, 32 new tokens)
headless against the full stack, and where the difference goes.

    python -m bench stack_overhead [--quick]

- headless: `workers.rft.loop.Loop` with in-memory stores (`python -m bench.stack_overhead headless`).
- full stack: the run is launched through `runs.services.launch_run` and executed by a real Celery
  worker (started here, queue default+train, `-c 1`) over Postgres and Redis, with its heartbeat,
  metrics stored and published live through the Channels layer. Seconds per step are taken from the
  trainer's MetricPoint times (step k - step k-1), so start-up and model loading are not counted;
  headless per-step times likewise skip the first step.
- profile: `workers.tasks.serve_duty` called in this process (everything the Celery task does, less
  Celery's messaging) with the storage methods timed, in ms per step, plus cProfile's top functions
  outside torch (bench/results/stack_profile.txt).

Headless and stack alternate (headless, stack, headless, ...). Uses DATABASE_URL / REDIS_URL from
bench.common.BENCH_ENV (database rftweb_d, recreated; Redis db 10, flushed) and drops the database
at the end.
"""
import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from bench.common import BENCH_ENV, PY, ROOT, THREAD_ENV, child, emit, load, machine, median, quiet_hf, save, table

TASKSET_SPEC = "arithmetic:n=200"
DJANGO_ENV = {
    **BENCH_ENV,
    "DJANGO_SETTINGS_MODULE": "rftweb.settings",
    "DEBUG": "0",
    "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
    "SECURE_COOKIES": "0",
    "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
}


def config_dict(steps: int, taskset: str = "bench-arithmetic") -> dict:
    return {
        "seed": 0,
        "model": {"path": "tiny"},
        "algorithm": {"name": "grpo", "repeat_times": 8},
        "explorer": {"engine": "transformers", "batch_size": 16, "max_new_tokens": 32},
        "trainer": {"lr": 1e-6, "micro_batch_size": 32, "total_steps": steps},
        "buffer": {"taskset": taskset},
    }


def headless(steps: int) -> dict:
    from workers.rft.config import RunConfig
    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    config = RunConfig.from_dict(config_dict(steps, TASKSET_SPEC))
    times = []
    with tempfile.TemporaryDirectory() as work_dir:
        stores = memory_stores(config)
        loop = Loop(config, stores, work_dir)
        for _ in range(steps):
            started = time.perf_counter()
            loop.explore()
            loop.train()
            times.append(time.perf_counter() - started)
    points = stores.metrics.points
    return {"step_s": times[1:], **{f"{role}_s": [points[(role, step)]["seconds"] for step in range(2, steps + 1)]
                                    for role in ("explorer", "trainer")}}


# ---- the stack ----------------------------------------------------------------------------------

def setup_django():
    os.environ.update(DJANGO_ENV)
    import django

    django.setup()


def create_database() -> None:
    import psycopg

    name = DJANGO_ENV["DATABASE_URL"].rsplit("/", 1)[1]
    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")


def drop_database() -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    name = DJANGO_ENV["DATABASE_URL"].rsplit("/", 1)[1]
    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(DJANGO_ENV["REDIS_URL"]).flushdb()


def prepare():
    """Migrate the fresh database, a researcher and the taskset; returns the user."""
    from django.core.management import call_command

    from apps.accounts.services import create_user
    from apps.tasksets.models import Task, Taskset
    from workers.rft.memory import load_tasks

    call_command("migrate", verbosity=0)
    user = create_user("bench", "bench-password-1", roles=["researcher"])
    taskset = Taskset.objects.create(name="bench-arithmetic")
    Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=t.prompt, answer=t.answer, metadata=t.metadata)
        for i, t in enumerate(load_tasks(TASKSET_SPEC))
    )
    return user


def trainer_step_seconds(run) -> list[float]:
    times = list(run.metrics.filter(role="trainer").order_by("step").values_list("time", flat=True))
    return [(b - a).total_seconds() for a, b in zip(times, times[1:])]


def role_seconds(run, role: str) -> list[float]:
    """The `seconds` each step of `role` logged (its own work, storage included), the first step left out."""
    points = run.metrics.filter(role=role, step__gte=2).order_by("step").values_list("values", flat=True)
    return [values["seconds"] for values in points]


def full_stack(user, steps: int, index: int) -> dict:
    from apps.runs import services

    worker = subprocess.Popen(
        [PY, "-m", "celery", "-A", "rftweb", "worker", "-Q", "default,train", "-c", "1", "-l", "warning",
         "--without-gossip", "--without-mingle"],
        cwd=ROOT, start_new_session=True, env={**os.environ, **THREAD_ENV},
    )
    try:
        run = services.launch_run(user, f"overhead-{index}", config_dict(steps))
        deadline = time.monotonic() + 3600
        while not run.is_finished and time.monotonic() < deadline:
            time.sleep(1)
            run.refresh_from_db()
        assert run.status == "completed", (run.status, run.error)
        return {
            "step_s": trainer_step_seconds(run), "explorer_s": role_seconds(run, "explorer"),
            "trainer_s": role_seconds(run, "trainer"), "total_s": (run.finished_at - run.started_at).total_seconds(),
        }
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def profile_stack(user, steps: int) -> dict:
    """serve_duty in this process, with every storage method and the loop's steps timed."""
    import apps.buffer.store as buffer_store
    import apps.runs.store as run_store
    import apps.tasksets.store as task_store
    from apps.runs import services, supervision
    from workers import tasks as worker_tasks
    from workers.rft.loop import Loop

    spent = defaultdict(float)
    calls = defaultdict(int)

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started
                calls[label] += 1

        setattr(owner, name, wrapper)
        return owner, name, original

    patches = [timed(Loop, "explore", "loop.explore (all)"), timed(Loop, "train", "loop.train (all)")]
    for cls, label in [(buffer_store.DjangoExperienceBuffer, "buffer"), (task_store.DjangoTaskSource, "tasks"),
                       (run_store.DjangoMetricSink, "metrics"), (run_store.DjangoCheckpointStore, "checkpoints")]:
        for name in [n for n in vars(cls) if not n.startswith("_") and callable(vars(cls)[n])]:
            patches.append(timed(cls, name, f"{label}.{name}"))
    patches.append(timed(supervision, "wait_while_paused", "run status check (wait_while_paused)"))
    run = services.launch_run(user, "overhead-profile", config_dict(steps))
    run.refresh_from_db()
    profiler = cProfile.Profile()
    try:
        # the Celery task's own body, synchronously (start_run's status change first)
        services.set_status(run, "starting") if run.status == "queued" else None
        profiler.enable()
        outcome = worker_tasks.serve_duty(run.pk, "loop")
        profiler.disable()
    finally:
        for owner, name, original in patches:
            setattr(owner, name, original)
    run.refresh_from_db()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(40)
    stream.write("\n--- outside torch: rftweb, Django's database layer, psycopg, Channels, Redis ---\n")
    stats.sort_stats("cumulative").print_stats(r"apps/|workers/tasks|django/db/|psycopg|channels|redis|live", 60)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "stack_profile.txt").write_text(stream.getvalue())
    per_step = {k: 1000 * v / steps for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    return {"outcome": outcome, "status": run.status, "ms_per_step": per_step, "calls": dict(calls),
            "step_s": trainer_step_seconds(run)}


def stack_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["headless", "stack", "profile"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    quiet_hf()
    if args.what == "headless":
        emit(headless(args.steps))
        return
    setup_django()
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="bench")
    if args.what == "stack":
        emit(full_stack(user, args.steps, args.index))
    else:
        emit(profile_stack(user, args.steps))


def stack_overhead(steps: int = 6, reps: int = 3) -> dict:
    results = {"machine": machine(), "steps": steps, "reps": reps, "runs": []}
    env = {**DJANGO_ENV}
    # the parent prepares the database, the children use it
    os.environ.update(DJANGO_ENV)
    create_database()
    flush_redis()
    prep = subprocess.run([PY, "-c", "import django, os; django.setup(); "
                                     "from bench.stack_overhead import prepare; prepare()"],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
    if prep.returncode:
        raise RuntimeError(prep.stderr[-3000:])
    try:
        alone, stack = [], []
        for rep in range(reps):
            out = child("bench.stack_overhead", "headless", "--steps", steps, env=env)
            alone.append(median(out["step_s"]))
            results["runs"].append({"side": "headless", **out, "load": load()})
            out = child("bench.stack_overhead", "stack", "--steps", steps, "--index", rep, env=env)
            stack.append(median(out["step_s"]))
            results["runs"].append({"side": "stack", **out, "load": load()})
            print(f"rep {rep}: headless {alone[-1]:.2f} s/step, stack {stack[-1]:.2f} s/step (load {load()})",
                  flush=True)
        out = child("bench.stack_overhead", "headless", "--steps", steps, env=env)
        alone.append(median(out["step_s"]))
        results["runs"].append({"side": "headless", **out, "load": load()})
        profile = child("bench.stack_overhead", "profile", "--steps", steps, env=env)
        results["profile"] = profile
    finally:
        flush_redis()
        drop_database()
    # Each stack rep against the mean of the headless reps on either side of it: this machine's
    # speed drifts within a sitting (headless 1.31, 1.44, 1.56 s/step in one run), and the two
    # sides' medians compare reps taken at different points of the drift.
    paired = [stack[i] / ((alone[i] + alone[i + 1]) / 2) - 1 for i in range(len(stack))]
    h, s, overhead = median(alone), median(stack), median(paired)
    sides = {side: [run for run in results["runs"] if run["side"] == side] for side in ("headless", "stack")}
    parts = {side: {role: median([x for run in runs for x in run[f"{role}_s"]]) for role in ("explorer", "trainer")}
             for side, runs in sides.items()}
    results["summary"] = {"headless_s": h, "stack_s": s, "overhead": overhead, "overhead_per_rep": paired,
                          "parts_s": parts, "load_end": load()}
    save("stack_overhead", results)
    print(table([["headless engine", h, parts["headless"]["explorer"], parts["headless"]["trainer"], ""],
                 ["full stack", s, parts["stack"]["explorer"], parts["stack"]["trainer"],
                  f"{overhead * 100:+.1f}% (per rep {', '.join(f'{p * 100:+.1f}%' for p in paired)})"]],
                ["side", "s/step", "explorer s", "trainer s", "overhead, paired"]))
    print("where the stack spends its time (in-process serve_duty, ms/step):")
    for name, ms in list(profile["ms_per_step"].items())[:12]:
        print(f"  {ms:9.1f} ms  {name}")
    return results


def drop_database_main():
    drop_database()


if __name__ == "__main__":
    stack_main(sys.argv[1:])
