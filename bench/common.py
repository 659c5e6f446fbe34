"""Shared helpers for the benchmarks: machine facts, child processes, medians, results files.

Every benchmark runs its baseline and rftweb in the same process tree (children of one parent),
alternating, several repetitions, so both sides see the same machine load; it reports medians and
the ratio, and the load average while it ran. Figures, not pass/fail.
"""
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable

# Threads per process, the same for both sides. On a shared, loaded machine (more runnable
# processes than cores) OpenMP's spinning threads wait on preempted peers: 2 threads ran the tiny
# model's rollouts ~10x slower than 1. BENCH_THREADS overrides; `nproc` is right on an idle machine.
THREADS = os.environ.get("BENCH_THREADS", "1")
THREAD_ENV = {"OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS}

# Benchmarks that need a database or Redis use these, never the default ones.
BENCH_ENV = {
    "DATABASE_URL": "postgres://postgres@localhost:5432/rftweb_d",
    "REDIS_URL": "redis://localhost:6379/10",
    "RFTWEB_DATA_DIR": str(ROOT / "data" / "bench"),
}


def machine() -> dict:
    """nproc, RAM, CPU model and the load right now."""
    mem_kb = 0
    cpu = platform.processor()
    try:
        mem_kb = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   cpu)
    except (OSError, StopIteration):
        pass
    import torch

    return {
        "nproc": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "cpu": cpu,
        "torch": torch.__version__,
        "threads_per_process": int(THREADS),
        "load": load(),
        "commit": git_commit(),
    }


def git_commit() -> str:
    """The commit measured, with '+dirty' when the engine or apps have uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "workers", "apps"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def load() -> str:
    """The `uptime` load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def peak_rss_mb() -> float:
    """This process's peak resident memory (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def percentile(values, q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def child(module: str, *args, env: dict | None = None, timeout: float = 1800) -> dict:
    """Run `python -m <module> <args>` as a child; its last stdout line is a JSON object."""
    started = time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **THREAD_ENV, **(env or {}), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        if proc.returncode == 3:  # a correctness check failed: never report timings over it
            raise AssertionError(f"LOSS MISMATCH in {module} {' '.join(map(str, args))}: see above")
        raise RuntimeError(f"{module} {' '.join(map(str, args))} failed (exit {proc.returncode})")
    result = json.loads(lines[-1])
    result.setdefault("wall_s", time.perf_counter() - started)
    return result


def emit(result: dict) -> None:
    """A child's answer: one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **data}
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value) -> str:
    if value is None:  # not measured
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def quiet_hf() -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
