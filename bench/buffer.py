"""The Postgres buffer (apps/buffer/store.py, through Django): write rate and sample latency.

    python -m bench buffer [--quick | --full]         10^6 rows (2 x 10^5 with --quick, 10^7 with --full)
    python -m bench.buffer [--full | --rows N] [--writers 0 1 2 8]

1. Write rate: experiences per second through `DjangoExperienceBuffer.write`, in batches of 128
   (one explorer step of 16 tasks x 8 samples), each with 512-token arrays (64 prompt ids, 512
   response ids, mask and logprobs), one writer; median of the batches. Beside it, the baseline:
   the same COPY into a bare copy of the table (no index, constraint or trigger).
2. Sample latency: `DjangoExperienceBuffer.sample(256)` (claims its rows, SKIP LOCKED) then
   `mark_used(consumed=...)`, as a trainer step does, with `--rows` ready rollouts of the run in
   the table (10^6 by default, 10^7 with --full: ~30 GB of disk, FULL_FILL_TOKENS) and 1,000 expert rows (built
   outside the timed part: 1,000 distinct rows COPYed into a staging table, then INSERT ... SELECT
   over generate_series), alone (the baseline) and while 1, 2 and 8 writer processes keep writing
   128-row batches; p50 / p95 of each, and the writers' rate meanwhile.
3. The plans (EXPLAIN ANALYZE, rolled back) of the statements a sample of rollouts, one of expert
   data and a MIX step's sample_mix send, printed and saved in bench/results/buffer_plans.txt.
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
# 10^7 rows of 512-token responses take ~80 GB (8 KB a row: heap, and each 2 KB array in two TOAST
# chunks of at most 1,996 bytes); --full fills its rows with 128-token responses (~30 GB). The
# writers' rows, which the samples take first (oldest step first), keep 512.
FULL_FILL_TOKENS = 128
PROMPT = 64
BATCH = 128
WRITES = 24  # batches timed for the write rate (12 gave medians 10 % apart run to run here)
# A response's text: ~800 characters of varied words, as a model writes them. A single repeated
# character (what this bench wrote before) is one word to full-text search and hid its cost:
# 13 against 67 us a row for the tsvector here (bench/README, #29's fourth slice).
WORDS = ("the model adds twelve and thirty then checks each digit carry so the answer is forty two "
         "first we write both numbers in columns and sum them from the right").split()


def response_text(rng: random.Random) -> str:
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(120))[:800]


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


def experiences(step: int, rng: random.Random, task_ids: list[int]):
    """One explorer step's batch: 16 tasks x 8 rollouts. With their tasks, as a run's rollouts
    are: a write then leaves replays to the natural key's constraint (store.write)."""
    from workers.rft.experience import Experience

    out = []
    for i in range(BATCH):
        out.append(Experience(
            task_id=task_ids[i // 8], group_id=f"{step}-{i // 8}", rollout_index=i, explorer_step=step,
            prompt_ids=[rng.randrange(49152) for _ in range(PROMPT)],
            response_ids=[rng.randrange(49152) for _ in range(TOKENS)], action_mask=[1] * TOKENS,
            logprobs=[-rng.random() * 5 for _ in range(TOKENS)], prompt_text="What is 12 + 30?",
            response_text=response_text(rng), reward=float(rng.random() < 0.5), advantage=rng.gauss(0, 1),
            reward_components={"exact_match": 1.0}, model_version=step, metadata={"finish_reason": "length"},
        ))
    return out


def writer(run_id: int, task_ids: list[int], first_step: int, stop_at: float, counts) -> None:
    sys.path.insert(0, str(ROOT))
    django_env()
    from apps.buffer.store import DjangoExperienceBuffer

    buffer = DjangoExperienceBuffer(run_id)
    rng = random.Random(first_step)
    step = first_step
    batches = [experiences(first_step + k, rng, task_ids) for k in range(4)]  # generated once: time the writes
    while time.time() < stop_at:
        exps = batches[step % 4]
        for e in exps:
            e.explorer_step = step
        buffer.write(exps)
        counts.append(len(exps))
        step += 1


def fill(run_id: int, task_ids: list[int], rows: int, tokens: int = TOKENS) -> float:
    """`rows` ready rollouts of the run: COPY 1,000 distinct ones, multiply them server-side. The
    secondary indexes are dropped for the fill and built again after it (10^7 rows row by row
    into 9 indexes would take most of an hour here); the fill's pending search range is dropped
    too: its documents stand for an indexer that kept up, and are not what is measured."""
    import numpy as np
    from django.db import connection

    started = time.perf_counter()
    rng = random.Random(0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'buffer_experience' "
            "AND indexname <> 'buffer_experience_pkey'"
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f"DROP INDEX {name}")
        cursor.execute(
            "CREATE UNLOGGED TABLE bench_template (n int, prompt_ids bytea, response_ids bytea, "
            "action_mask bytea, logprobs bytea)"
        )
        raw = cursor.connection  # psycopg 3 connection
        with raw.cursor().copy("COPY bench_template FROM STDIN") as copy:
            for n in range(1000):
                copy.write_row((
                    n, np.array([rng.randrange(49152) for _ in range(PROMPT)], "<i4").tobytes(),
                    np.array([rng.randrange(49152) for _ in range(tokens)], "<i4").tobytes(),
                    np.ones(tokens, "u1").tobytes(),
                    np.array([-rng.random() * 5 for _ in range(tokens)], "<f4").tobytes(),
                ))
        cursor.execute(
            """
            INSERT INTO buffer_experience (
                run_id, task_id, explorer_step, group_id, rollout_index, source, status, prompt_text,
                response_text, prompt_ids, response_ids, action_mask, logprobs, reward, reward_components,
                advantage, model_version, priority, use_count, metadata, created_at)
            SELECT %s, (%s::int[])[1 + (g / 8) %% 16], 1000000 + g / 128, 'g' || (g / 8), g %% 128, 'rollout',
                   'ready', 'What is 12 + 30?',
                   repeat('x', 800), t.prompt_ids, t.response_ids, t.action_mask, t.logprobs,
                   (g %% 2)::float, '{"exact_match": 1.0}'::jsonb, 0.5, g / 128, 0, 0,
                   '{"finish_reason": "length"}'::jsonb, now()
            FROM generate_series(0, %s - 1) AS g JOIN bench_template t ON t.n = g %% 1000
            """,
            [run_id, task_ids, rows],
        )
        cursor.execute(  # the expert data a mix or SFT step samples beside the rollouts
            """
            INSERT INTO buffer_experience (
                run_id, explorer_step, group_id, rollout_index, source, status, prompt_text, response_text,
                prompt_ids, response_ids, action_mask, reward_components, advantage, model_version, priority,
                use_count, metadata, created_at)
            SELECT %s, 0, 'expert-' || t.n, 0, 'expert', 'ready', 'What is 12 + 30?', repeat('x', 800),
                   t.prompt_ids, t.response_ids, t.action_mask, '{}'::jsonb, 0, 0, 0, 0, '{}'::jsonb, now()
            FROM bench_template t
            """,
            [run_id],
        )
        cursor.execute("DROP TABLE bench_template")
        cursor.execute("DELETE FROM buffer_search_pending")
        cursor.execute("SET maintenance_work_mem = '1GB'")
        for _, definition in indexes:
            cursor.execute(definition)
        cursor.execute("ANALYZE buffer_experience")
    return time.perf_counter() - started


def buffer(rows: int = 1_000_000, samples: int = 30, writer_counts=(0, 1, 2, 8), fill_tokens: int = TOKENS) -> dict:
    admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)", f"CREATE DATABASE {DB_NAME}")
    try:
        django_env()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return _measure(rows, samples, writer_counts, fill_tokens)
    finally:
        from django.db import connections

        connections.close_all()
        admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def _measure(rows: int, samples: int, writer_counts, fill_tokens: int) -> dict:
    from apps.accounts.services import create_user
    from apps.buffer import search
    from apps.buffer.store import DjangoExperienceBuffer
    from apps.runs.models import Run
    from apps.tasksets.models import Task, Taskset

    results = {"machine": machine(), "rows": rows, "tokens": TOKENS, "fill_tokens": fill_tokens, "samples": samples}
    user = create_user("bench", "bench-password-1", roles=["researcher"])
    run = Run.objects.create(name="buffer", owner=user, config={})
    taskset = Taskset.objects.create(name="bench", task_count=16)
    task_ids = [t.pk for t in Task.objects.bulk_create(
        Task(taskset=taskset, index=i, prompt=f"What is {i} + 30?", answer=str(i + 30)) for i in range(16))]
    buffer = DjangoExperienceBuffer(run.pk)
    rng = random.Random(1)
    batches = [experiences(step, rng, task_ids) for step in range(4)]
    results["write_per_s"] = write_rate(buffer.write, batches)
    results["write_floor_per_s"] = write_floor(batches, run.pk)
    print(f"write: {results['write_per_s']:.0f} experiences/s ({TOKENS}-token arrays, batches of {BATCH}); "
          f"the same COPY into a bare table: {results['write_floor_per_s']:.0f}/s; load {load()}", flush=True)
    started = time.perf_counter()  # the search documents of those writes, made after them (apps/buffer/search.py)
    search.catch_up(seconds=600)
    results["index_per_s"] = WRITES * BATCH / (time.perf_counter() - started)
    print(f"search index: {results['index_per_s']:.0f} documents/s", flush=True)

    results["fill_s"] = fill(run.pk, task_ids, rows, fill_tokens)
    print(f"filled {rows:,} rows in {results['fill_s']:.0f} s", flush=True)
    plans = sample_plans(buffer)
    print(plans, flush=True)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "buffer_plans.txt").write_text(plans + "\n")
    results["sample_plans"] = plans

    table_rows = [
        [f"write {BATCH} x {TOKENS}-token exps", f"{results['write_per_s']:.0f} /s", "one writer"],
        ["the same COPY into a bare table", f"{results['write_floor_per_s']:.0f} /s",
         "baseline: no index, constraint or trigger"],
        ["their search documents, after", f"{results['index_per_s']:.0f} /s", "one indexer"],
    ]
    for count in writer_counts:
        figures = with_writers(buffer, run.pk, task_ids, count, samples)
        results[f"writers_{count}"] = figures
        table_rows += [
            [f"sample 256 of {rows:,} rows, p50 / p95",
             f"{figures['sample_p50_ms']:.0f} / {figures['sample_p95_ms']:.0f} ms",
             f"{count} writers: {figures['write_per_s']:.0f} exps/s" if count else "alone: the baseline"],
            ["mark_used 256 consumed, p50 / p95",
             f"{figures['mark_used_p50_ms']:.0f} / {figures['mark_used_p95_ms']:.0f} ms", f"{count} writers"],
            ["search documents made meanwhile", f"{figures['index_per_s']:.0f} /s",
             f"backlog at the end: {figures['search_backlog']:,} rows"],
        ]
    results["load_end"] = load()
    save("buffer", results)
    print(table(table_rows, ["figure", "value", "with"]))
    return results


def write_rate(write, batches, count: int = WRITES) -> float:
    """The median experiences/s of `count` writes of the batches in turn, each a new step."""
    rates = []
    for step in range(count):
        exps = batches[step % len(batches)]
        for e in exps:
            e.explorer_step = step
        started = time.perf_counter()
        write(exps)
        rates.append(len(exps) / (time.perf_counter() - started))
    return median(rates)


def write_floor(batches, run_id: int) -> float:
    """The baseline of the write rate: store.insert's COPY of the same batches, one transaction
    each, into a bare copy of the table (its columns, none of its indexes, constraints or
    triggers), swapped in under the table's name and out again. What Postgres and the client
    take for the rows themselves on this machine, which no change to the buffer's indexes or
    statements can go below."""
    from django.db import connection, transaction

    from apps.buffer.store import insert

    def write(exps):
        with transaction.atomic():
            insert(exps, run_id)

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_bare (LIKE buffer_experience INCLUDING DEFAULTS INCLUDING IDENTITY)")
        cursor.execute("ALTER TABLE buffer_experience RENAME TO bench_real")
        cursor.execute("ALTER TABLE bench_bare RENAME TO buffer_experience")
    try:
        return write_rate(write, batches)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE buffer_experience")
            cursor.execute("ALTER TABLE bench_real RENAME TO buffer_experience")


def indexer(stop_at: float, made) -> None:
    """What beat's apps.buffer.tasks.index_search does, every second instead of every 10 s."""
    sys.path.insert(0, str(ROOT))
    django_env()
    from apps.buffer import search

    while time.time() < stop_at:
        started = time.time()
        while time.time() - started < 1:
            count, left = search.index_pending()
            made.append((time.time(), count))
            if not left:
                break
        time.sleep(max(0.0, 1 - (time.time() - started)))


def with_writers(buffer, run_id: int, task_ids: list[int], count: int, samples: int) -> dict:
    """sample(256) then mark_used, `samples` times, while `count` writer processes write and an
    indexer makes their search documents. With 0 writers, the baseline: the statements alone."""
    from django.db import connections

    from apps.buffer import search

    manager = multiprocessing.Manager()
    written = manager.list()
    stop_at = time.time() + 3600
    ctx = multiprocessing.get_context("spawn")
    made = manager.list()
    procs = [
        ctx.Process(target=writer, args=(run_id, task_ids, 100_000 * count + 10_000 * (k + 1), stop_at, written))
        for k in range(count)
    ] + [ctx.Process(target=indexer, args=(stop_at, made))]
    connections.close_all()
    for p in procs:
        p.start()
    deadline = time.time() + 300
    while (len(written) < 2 * count or not made) and time.time() < deadline:  # all writing, the indexer too
        time.sleep(0.5)
    if count and not written:
        raise RuntimeError("the concurrent writers wrote nothing")
    sample_s, mark_s = [], []
    written_before, started_all = len(written), time.time()
    for _ in range(samples):
        started = time.perf_counter()
        got = buffer.sample(256, sources=["rollout"])
        sampled = time.perf_counter()
        buffer.mark_used(consumed=got)
        sample_s.append(sampled - started)
        mark_s.append(time.perf_counter() - sampled)
        assert len(got) == 256
    ended = time.time()
    rate = sum(written[written_before:]) / (ended - started_all)
    rounds = list(made)  # the indexer's whole phase: the samples alone last a second or two
    index_rate = sum(n for _, n in rounds) / max(ended - rounds[0][0], 1e-9)
    for p in procs:
        p.terminate()
        p.join(10)
    manager.shutdown()
    print(f"{count} writers: sample p50 {1000 * percentile(sample_s, 0.5):.0f} ms, load {load()}", flush=True)
    return {
        "sample_p50_ms": 1000 * percentile(sample_s, 0.5), "sample_p95_ms": 1000 * percentile(sample_s, 0.95),
        "mark_used_p50_ms": 1000 * percentile(mark_s, 0.5), "mark_used_p95_ms": 1000 * percentile(mark_s, 0.95),
        "write_per_s": rate, "index_per_s": index_rate, "search_backlog": search.backlog(),
    }


def sample_plans(buffer) -> str:
    """EXPLAIN ANALYZE of what one sample of rollouts and one of expert data send (caught as the
    store sends them, so the plan is of the real statement: Django's statements by an execute
    wrapper, the claim, which goes on a cursor of its own, from store.claim_statement), each in a
    transaction rolled back."""
    from django.db import connection, transaction

    from apps.buffer import store
    from workers.rft.experience import EXPERT_SOURCES

    plans, compile_claim = [], store.claim_statement
    samples = {
        "sample(256, sources=['rollout'])": lambda: buffer.sample(256, sources=["rollout"]),
        f"sample(256, sources={list(EXPERT_SOURCES)})": lambda: buffer.sample(256, sources=EXPERT_SOURCES),
        "sample_mix(256, 64) (MIX, expert_data_ratio 0.2)": lambda: buffer.sample_mix(256, 64),
    }
    for name, take in samples.items():
        sent = []

        def catch(execute, sql, params, many, context, sent=sent):
            sent.append((sql, params))
            return execute(sql, params, many, context)

        def claim_statement(picks, claimer, sent=sent):
            statement = compile_claim(picks, claimer)
            sent.append(statement)
            return statement

        store.claim_statement = claim_statement
        try:
            with connection.execute_wrapper(catch):
                take()
        finally:
            store.claim_statement = compile_claim
        for sql, params in sent:
            if "buffer_experience" not in sql or not sql.lstrip().startswith(("SELECT", "WITH", "UPDATE")):
                continue
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                transaction.set_rollback(True)
            plans.append(f"-- {name}:\n{sql}\n-- params {params}\n{plan}")
    return "\n\n".join(plans)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.buffer")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--full", action="store_true", help=f"10^7 rows of {FULL_FILL_TOKENS}-token responses")
    parser.add_argument("--writers", type=int, nargs="+", default=[0, 1, 2, 8])
    parser.add_argument("--fill-tokens", type=int, help=f"the filled rows' response tokens (default {TOKENS}; "
                        f"{FULL_FILL_TOKENS} with --full)")
    args = parser.parse_args()
    buffer(rows=10_000_000 if args.full else args.rows, writer_counts=args.writers,
           fill_tokens=args.fill_tokens or (FULL_FILL_TOKENS if args.full else TOKENS))
