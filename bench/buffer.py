"""The Postgres buffer (apps/buffer/store.py, through Django): write rate and sample latency.

    python -m bench buffer [--quick]

1. Write rate: experiences per second through `DjangoExperienceBuffer.write`, in batches of 128
   (one explorer step of 16 tasks x 8 samples), each with 512-token arrays (64 prompt ids, 512
   response ids, mask and logprobs), one writer; median of the batches.
2. Sample latency: `DjangoExperienceBuffer.sample(256)` (claims its rows, SKIP LOCKED) with
   `--rows` ready rows of the run in the table (10^6 by default; built fast: 1,000 distinct rows
   COPYed into a staging table, then INSERT ... SELECT over generate_series), while 2 writer
   processes keep writing 128-row batches; p50 / p95 over the samples, and the writers' rate.
Runs in its own database (rftweb_d_buffer), dropped at the end. Figures, not pass/fail.
"""
import multiprocessing
import os
import random
import sys
import time

from bench.common import BENCH_ENV, ROOT, load, machine, median, percentile, save, table

DB_NAME = "rftweb_d_buffer"
TOKENS = 512
PROMPT = 64
BATCH = 128


def django_env():
    os.environ.update({
        **BENCH_ENV,
        "DATABASE_URL": BENCH_ENV["DATABASE_URL"].rsplit("/", 1)[0] + "/" + DB_NAME,
        "DJANGO_SETTINGS_MODULE": "rftweb.settings", "DEBUG": "0",
        "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
    })
    import django

    django.setup()


def admin_sql(*statements):
    import psycopg

    with psycopg.connect("postgresql://postgres@localhost:5432/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def experiences(step: int, rng: random.Random):
    from workers.rft.experience import Experience

    out = []
    for i in range(BATCH):
        out.append(Experience(
            task_id=None, group_id=f"{step}-{i // 8}", rollout_index=i, explorer_step=step,
            prompt_ids=[rng.randrange(49152) for _ in range(PROMPT)],
            response_ids=[rng.randrange(49152) for _ in range(TOKENS)], action_mask=[1] * TOKENS,
            logprobs=[-rng.random() * 5 for _ in range(TOKENS)], prompt_text="What is 12 + 30?",
            response_text="x" * 800, reward=float(rng.random() < 0.5), advantage=rng.gauss(0, 1),
            reward_components={"exact_match": 1.0}, model_version=step, metadata={"finish_reason": "length"},
        ))
    return out


def writer(run_id: int, first_step: int, stop_at: float, counts) -> None:
    sys.path.insert(0, str(ROOT))
    django_env()
    from apps.buffer.store import DjangoExperienceBuffer

    buffer = DjangoExperienceBuffer(run_id)
    rng = random.Random(first_step)
    step = first_step
    batches = [experiences(first_step + k, rng) for k in range(4)]  # generated once: time the writes
    while time.time() < stop_at:
        exps = batches[step % 4]
        for e in exps:
            e.explorer_step = step
        buffer.write(exps)
        counts.append(len(exps))
        step += 1


def fill(run_id: int, rows: int) -> float:
    """`rows` ready rollouts of the run: COPY 1,000 distinct ones, multiply them server-side."""
    from django.db import connection

    from apps.buffer.fields import PackedArrayField  # noqa: F401
    started = time.perf_counter()
    rng = random.Random(0)
    import numpy as np

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE UNLOGGED TABLE bench_template (n int, prompt_ids bytea, response_ids bytea, "
            "action_mask bytea, logprobs bytea)"
        )
        raw = cursor.connection  # psycopg 3 connection
        with raw.cursor().copy("COPY bench_template FROM STDIN") as copy:
            for n in range(1000):
                copy.write_row((
                    n, np.array([rng.randrange(49152) for _ in range(PROMPT)], "<i4").tobytes(),
                    np.array([rng.randrange(49152) for _ in range(TOKENS)], "<i4").tobytes(),
                    np.ones(TOKENS, "u1").tobytes(),
                    np.array([-rng.random() * 5 for _ in range(TOKENS)], "<f4").tobytes(),
                ))
        cursor.execute(
            """
            INSERT INTO buffer_experience (
                run_id, explorer_step, group_id, rollout_index, source, status, prompt_text, response_text,
                prompt_ids, response_ids, action_mask, logprobs, reward, reward_components, advantage,
                model_version, priority, use_count, metadata, created_at)
            SELECT %s, 1000000 + g / 128, 'g' || (g / 8), g %% 128, 'rollout', 'ready', 'What is 12 + 30?',
                   repeat('x', 800), t.prompt_ids, t.response_ids, t.action_mask, t.logprobs,
                   (g %% 2)::float, '{"exact_match": 1.0}'::jsonb, 0.5, g / 128, 0, 0,
                   '{"finish_reason": "length"}'::jsonb, now()
            FROM generate_series(0, %s - 1) AS g JOIN bench_template t ON t.n = g %% 1000
            """,
            [run_id, rows],
        )
        cursor.execute("DROP TABLE bench_template")
        cursor.execute("ANALYZE buffer_experience")
    return time.perf_counter() - started


def buffer(rows: int = 1_000_000, samples: int = 30, writers: int = 2) -> dict:
    admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)", f"CREATE DATABASE {DB_NAME}")
    try:
        django_env()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return _measure(rows, samples, writers)
    finally:
        from django.db import connections

        connections.close_all()
        admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def _measure(rows: int, samples: int, writers: int) -> dict:
    from apps.accounts.services import create_user
    from apps.buffer.store import DjangoExperienceBuffer
    from apps.runs.models import Run

    results = {"machine": machine(), "rows": rows, "tokens": TOKENS}
    user = create_user("bench", "bench-password-1", roles=["researcher"])
    run = Run.objects.create(name="buffer", owner=user, config={})
    buffer = DjangoExperienceBuffer(run.pk)
    rng = random.Random(1)
    batches = [experiences(step, rng) for step in range(4)]
    rates = []
    for step in range(12):
        exps = batches[step % 4]
        for e in exps:
            e.explorer_step = step
        started = time.perf_counter()
        buffer.write(exps)
        rates.append(len(exps) / (time.perf_counter() - started))
    results["write_per_s"] = median(rates)
    print(f"write: {results['write_per_s']:.0f} experiences/s ({TOKENS}-token arrays, batches of {BATCH}), "
          f"load {load()}", flush=True)

    results["fill_s"] = fill(run.pk, rows)
    print(f"filled {rows} rows in {results['fill_s']:.0f} s", flush=True)

    manager = multiprocessing.Manager()
    counts = manager.list()
    stop_at = time.time() + 3600
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=writer, args=(run.pk, 10_000 * (k + 1), stop_at, counts)) for k in range(writers)]
    from django.db import connections

    connections.close_all()
    for p in procs:
        p.start()
    deadline = time.time() + 300
    while len(counts) < 2 * writers and time.time() < deadline:  # the writers are writing
        time.sleep(0.5)
    if not counts:
        raise RuntimeError("the concurrent writers wrote nothing")
    latencies = []
    count_before, started_all = len(counts), time.time()
    for _ in range(samples):
        started = time.perf_counter()
        got = buffer.sample(256, sources=["rollout"])
        latencies.append(time.perf_counter() - started)
        assert len(got) == 256
    # where one sample's time goes (functions by own time), while the writers still write
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    buffer.sample(256, sources=["rollout"])
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(20)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    from django.db import connection

    with connection.cursor() as cursor:  # the plan of the sampling query (the same filter and order)
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) SELECT id FROM buffer_experience WHERE run_id = %s AND status = 'ready' "
            "AND source IN ('rollout') AND claimed_at IS NULL ORDER BY use_count, explorer_step, id LIMIT 256 "
            "FOR UPDATE SKIP LOCKED", [run.pk])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    results["sample_plan"] = plan
    (ROOT / "bench" / "results" / "buffer_sample_profile.txt").write_text(stream.getvalue() + "\n" + plan + "\n")
    concurrent_rate = (sum(counts[count_before:]) if len(counts) > count_before else 0) / (time.time() - started_all)
    for p in procs:
        p.terminate()
        p.join(10)
    results.update(
        sample_p50_ms=1000 * percentile(latencies, 0.5), sample_p95_ms=1000 * percentile(latencies, 0.95),
        samples=samples, writers=writers, concurrent_write_per_s=concurrent_rate, load_end=load(),
    )
    save("buffer", results)
    print(table([[f"write {BATCH} x {TOKENS}-token exps", f"{results['write_per_s']:.0f} /s", "one writer"],
                 [f"sample 256 of {rows:,} rows, p50", f"{results['sample_p50_ms']:.0f} ms", f"{writers} writers"],
                 [f"sample 256 of {rows:,} rows, p95", f"{results['sample_p95_ms']:.0f} ms",
                  f"writers: {concurrent_rate:.0f} exps/s"]],
                ["figure", "value", "with"]))
    return results


if __name__ == "__main__":
    buffer(rows=int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
