"""Rollouts per second with 1 and with 2 explorers, through the real product (issue #19).

    python -m bench explorers [--quick]

Each case is a child of this parent (`python -m bench.explorers run ...`) that starts real Celery
workers, as a deployment would on one machine: one on queues default,train (the trainer) and two
on queue explore (`-c 1 --pool prefork`, each its own process), over Postgres (database
rftweb_bx_explorers, created, migrated and dropped here) and Redis db 11, RFTWEB_DATA_DIR=data/bench.
It launches a GRPO run through `apps.runs.services.launch_run` (mode both, SmolLM2-135M,
explorer.engine_num 1 or 2, synchronizer.method checkpoint or nccl, offset 1), waits for it to
complete, stops its workers, and reads what the run stored:

- rollouts/s: rollouts stored by the explorer steps after the first (warm-up: engines loading,
  the first version) / (the last such step's ExplorerStep.finished_at - the first one's opened_at);
  it includes every wait of the explorers (for the trainer's version, for each other);
- s/step: the median time between consecutive trainer steps (MetricPoint times; start-up excluded);
- explorer s/step: the median of finished_at - opened_at over the same explorer steps.

Sizes chosen so rollout is the larger cost: explorer.batch_size 8 x repeat_times 4 x 32 new tokens
(temperature 1) per explorer step, while the trainer trains on trainer.batch_size 8 of those 32
rollouts a step. The cases alternate (checkpoint 1, 2, nccl 2, 1, then the reverse); figures are
medians over repetitions. On a 2-core machine the trainer and two explorers share two cores:
a second explorer adds a process, not a core.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, RESULTS, ROOT, THREAD_ENV, child, emit, load, machine, median, quiet_hf, save, table

DATABASE = "rftweb_bx_explorers"
TASKSET = "bench-explorers-arithmetic"
ENV = {
    "DATABASE_URL": f"postgres://postgres@localhost:5432/{DATABASE}",
    "REDIS_URL": "redis://localhost:6379/11",
    "RFTWEB_DATA_DIR": str(ROOT / "data" / "bench"),
    "DJANGO_SETTINGS_MODULE": "rftweb.settings",
    "DEBUG": "0",
    "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
    "SECURE_COOKIES": "0",
    "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
    "RFTWEB_NODE_ADDRESS": "127.0.0.1",  # nccl: the trainer's weight group, on this machine
}
LOGS = RESULTS / "explorers_logs"


def config_dict(method: str, explorers: int, steps: int, model: str) -> dict:
    return {
        "seed": 0,
        "mode": "both",
        "model": {"path": model},
        "algorithm": {"name": "grpo", "repeat_times": 4},
        "explorer": {"engine": "transformers", "engine_num": explorers, "batch_size": 8, "max_new_tokens": 32,
                     "temperature": 1.0},
        "trainer": {"lr": 1e-6, "batch_size": 8, "micro_batch_size": 8, "total_steps": steps},
        "buffer": {"taskset": TASKSET},
        "synchronizer": {"method": method, "offset": 1},
    }


# ---- the parent's database ----------------------------------------------------------------------

def create_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")


def drop_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(ENV["REDIS_URL"]).flushdb()


def prepare() -> None:
    """Migrate, a researcher, the arithmetic taskset (as tests/workers/test_tasks.py make_taskset)."""
    import django

    django.setup()
    from django.core.management import call_command

    from apps.accounts.services import create_user
    from apps.tasksets.models import Task, Taskset
    from workers.rft import datasets

    call_command("migrate", verbosity=0)
    create_user("bench", "bench-password-1", roles=["researcher"])
    n = 400
    taskset = Taskset.objects.create(name=TASKSET, task_count=n)
    Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=row["prompt"], answer=row["answer"], metadata=row["metadata"])
        for i, row in enumerate(datasets.generate("arithmetic", n, seed=0, max_operand=9))
    )


# ---- one case, in a child: workers, the run, what it stored ----------------------------------------

def start_worker(queues: str, tag: str) -> tuple[subprocess.Popen, str, Path]:
    from rftweb.celery import app

    name = f"bx-{tag}-{uuid.uuid4().hex[:6]}@localhost"
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name.split('@')[0]}.log"
    proc = subprocess.Popen(
        [PY, "-m", "celery", "-A", "rftweb", "worker", "-Q", queues, "-c", "1", "--pool", "prefork", "-n", name,
         "--without-gossip", "--without-mingle", "-l", "info"],
        cwd=ROOT, env={**os.environ, **THREAD_ENV}, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if app.control.ping(destination=[name], timeout=0.5):
            return proc, name, log_path
        if proc.poll() is not None:
            break
    raise RuntimeError(f"celery worker {name} did not start:\n{log_path.read_text()[-3000:]}")


def stop_workers(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(run) -> dict:
    from apps.buffer.models import Experience
    from apps.runs.models import ExplorerStep

    done = list(ExplorerStep.objects.filter(run=run, finished_at__isnull=False).order_by("step"))
    timed = [s for s in done if s.step > 0]  # step 0: warm-up
    out = {"explorer_steps_done": len(done), "explorer_steps_timed": len(timed)}
    if timed:
        rollouts = Experience.objects.filter(run=run, source="rollout",
                                             explorer_step__in=[s.step for s in timed]).count()
        wall = (max(s.finished_at for s in timed) - min(s.opened_at for s in timed)).total_seconds()
        out |= {
            "rollouts": rollouts,
            "wall_s": wall,
            "rollouts_per_s": rollouts / wall if wall > 0 else float("nan"),
            "explorer_step_s": median((s.finished_at - s.opened_at).total_seconds() for s in timed),
            "explorers_per_step": [len({part["worker"] for part in s.parts}) for s in done],
            "rollouts_per_explorer": [{part["explorer"]: part.get("rollouts") for part in s.parts} for s in done],
            # what each explorer's part says of its time (explorer.py _timing), where it says it
            "sync_seconds": median(p["sync_seconds"] for s in timed for p in s.parts if "sync_seconds" in p),
            "idle_share": median(p["idle_share"] for s in timed for p in s.parts if "idle_share" in p),
        }
    times = list(run.metrics.filter(role="trainer").order_by("step").values_list("time", flat=True))
    step_s = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    out |= {"trainer_steps": len(times), "trainer_step_s": step_s, "s_per_step": median(step_s),
            "run_s": (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else None}
    return out


def run_case(method: str, explorers: int, steps: int, model: str, index: int) -> dict:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from apps.runs import services
    from apps.tasksets.models import Task
    from rftweb.celery import app

    user = get_user_model().objects.get(username="bench")
    Task.objects.filter(taskset__name=TASKSET).update(times_sampled=0)  # every case picks the same batches
    app.control.purge()
    procs, logs = [], []
    try:
        for queues, tag in (("default,train", "train"), ("explore", "explore1"), ("explore", "explore2")):
            proc, _, log_path = start_worker(queues, f"{index}-{tag}")
            procs.append(proc)
            logs.append(log_path)
        started = time.perf_counter()
        run = services.launch_run(user, f"explorers-{method}-{explorers}-{index}",
                                  config_dict(method, explorers, steps, model))
        deadline = time.monotonic() + 1500
        while not run.is_finished and time.monotonic() < deadline:
            time.sleep(1)
            run.refresh_from_db()
        result = {"method": method, "explorers": explorers, "status": run.status, "error": run.error,
                  "launch_to_end_s": time.perf_counter() - started, "logs": [str(p) for p in logs]}
        if run.status != "completed" and not run.is_finished:
            services.stop_run(run)
        result |= measure(run)
        return result
    finally:
        stop_workers(procs)


def child_main(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["run", "prepare"])
    parser.add_argument("--method", default="checkpoint")
    parser.add_argument("--explorers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.update(ENV)
    quiet_hf()
    if args.what == "prepare":
        prepare()
        emit({"prepared": True})
    else:
        emit(run_case(args.method, args.explorers, args.steps, args.model, args.index))


# ---- the parent -------------------------------------------------------------------------------------

def explorers(quick: bool = False, model: str = "smollm2-135m", methods=("checkpoint", "nccl")) -> dict:
    steps, reps = (5, 1) if quick else (8, 2)
    cases = [(m, n) for m in methods for n in ((1, 2) if methods.index(m) % 2 == 0 else (2, 1))]
    results = {"machine": machine(), "model": model, "steps": steps, "reps": reps, "threads_per_process":
               int(THREAD_ENV["OMP_NUM_THREADS"]), "config": config_dict("<method>", 0, steps, model), "runs": []}
    os.environ.update(ENV)
    create_database()
    flush_redis()
    try:
        child("bench.explorers", "prepare", env=ENV, timeout=600)
        for rep in range(reps):
            for method, n in (cases if rep % 2 == 0 else list(reversed(cases))):
                try:
                    out = child("bench.explorers", "run", "--method", method, "--explorers", n, "--steps", steps,
                                "--model", model, "--index", len(results["runs"]), env=ENV, timeout=1800)
                except RuntimeError as err:
                    out = {"method": method, "explorers": n, "status": "bench child failed", "error": str(err)}
                out["load"] = load()
                results["runs"].append(out)
                print(f"  {method} x{n}: {out['status']}, {out.get('rollouts_per_s', float('nan')):.2f} rollouts/s, "
                      f"{out.get('s_per_step', float('nan')):.1f} s/trainer step, explorers per step "
                      f"{out.get('explorers_per_step')} (load {out['load']})", flush=True)
                if out["status"] != "completed":
                    print(f"    error: {out.get('error')}", flush=True)
    finally:
        flush_redis()
        drop_database()
    summary, rows = [], []
    for method, n in cases:
        runs = [r for r in results["runs"] if (r["method"], r["explorers"]) == (method, n)
                and r["status"] == "completed" and r.get("rollouts_per_s")]
        entry = {"method": method, "explorers": n, "completed": len(runs),
                 "rollouts_per_s": median(r["rollouts_per_s"] for r in runs),
                 "s_per_step": median(r["s_per_step"] for r in runs),
                 "explorer_step_s": median(r["explorer_step_s"] for r in runs)}
        summary.append(entry)
    for entry in summary:
        one = next((e for e in summary if e["method"] == entry["method"] and e["explorers"] == 1), None)
        entry["vs_one"] = entry["rollouts_per_s"] / one["rollouts_per_s"] if one and one["rollouts_per_s"] else None
        rows.append([entry["method"], entry["explorers"], entry["rollouts_per_s"], entry["s_per_step"],
                     entry["explorer_step_s"], f"x{entry['vs_one']:.2f}" if entry["vs_one"] else "-"])
    results["summary"], results["load_end"] = summary, load()
    save("explorers", results)
    print(table(rows, ["sync", "explorers", "rollouts/s", "s/trainer step", "s/explorer step", "vs 1 explorer"]))
    return results


if __name__ == "__main__":
    child_main(sys.argv[1:])
