"""Server time and query count of the experience changelist on a generated buffer.

    python bench/admin_changelist.py [--rows 200000]

Runs in a throwaway database (<DATABASE_URL's database>_bench_changelist), fills it with
`--rows` generated experiences over 4 runs (texts of 10-60 words drawn from a 5,000-word
vocabulary, word k about k times rarer than word 1) plus feedback on 1% of them, then times the
curator's changelist with and without filters and searches. Figures, not pass/fail: they depend on
the machine and its load. The slow tests in tests/apps/buffer/test_admin_scale.py use the same
generator.
"""

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCABULARY = 5_000
RUN_COUNT = 4

# Word k of the vocabulary is drawn with probability ~ 1/k (log-uniform ranks), so a search can
# pick its selectivity: 'word3' is in a third of the texts, 'word900' in a few hundred. Drawing
# words is the slow part, so a pool of TEXT_POOL texts is drawn once and the rows combine them.
TEXT_POOL = 20_011
GENERATE_SQL = """
CREATE TEMPORARY TABLE bench_text (n int PRIMARY KEY, words text) ON COMMIT DROP;
INSERT INTO bench_text
SELECT p, (SELECT string_agg('word' || floor(exp(random() * ln(%(vocabulary)s)))::int, ' ')
           FROM generate_series(1, 5 + (p * 31) %% 21) AS i WHERE p IS NOT NULL)
FROM generate_series(0, %(pool)s - 1) AS p;
INSERT INTO buffer_experience (
    run_id, explorer_step, group_id, rollout_index, source, status, prompt_text, response_text,
    prompt_ids, response_ids, action_mask, logprobs, reward, reward_components, advantage,
    model_version, priority, use_count, metadata, created_at)
SELECT
    (%(runs)s::bigint[])[1 + g %% %(run_count)s], g / 64, 'group-' || (g / 8), g %% 8,
    (ARRAY['rollout', 'rollout', 'rollout', 'expert', 'synthetic'])[1 + g %% 5],
    (ARRAY['ready', 'ready', 'consumed', 'raw', 'rejected'])[1 + (g / 5) %% 5],
    'What is ' || (g %% 97) || ' + ' || (g %% 89) || '? ' || left(prompt.words, 40),
    response.words,
    decode(repeat('07000000', 24), 'hex'),
    decode(repeat('2a000000', 16 + g %% 200), 'hex'),
    CASE WHEN %(full_arrays)s THEN decode(repeat('01', 16 + g %% 200), 'hex') END,
    CASE WHEN %(full_arrays)s THEN decode(repeat('cdcc4cbf', 16 + g %% 200), 'hex') END,
    ((g * 7919) %% 1000) / 1000.0, '{"accuracy": 1.0}'::jsonb, 0.0,
    g / 6400, 0.0, 0, '{}'::jsonb, now()
FROM generate_series(1, %(rows)s) AS g
JOIN bench_text AS prompt ON prompt.n = (g * 7) %% %(pool)s
JOIN bench_text AS response ON response.n = g %% %(pool)s;
"""

# SQLite (the embedded demo's database) has no generate_series, string_agg or decode: the same rows
# are made in Python there (_sqlite_rows) and inserted with executemany: 12.5 s for 200,000.
INSERT_SQL = """
INSERT INTO buffer_experience (
    run_id, explorer_step, group_id, rollout_index, source, status, prompt_text, response_text,
    prompt_ids, response_ids, action_mask, logprobs, reward, reward_components, advantage,
    model_version, priority, use_count, metadata, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '{"accuracy": 1.0}', 0.0, %s, 0.0, 0, '{}', %s)
"""

FEEDBACK_SQL = """
INSERT INTO feedback_feedback (
    experience_id, user_id, kind, value, label, edited_text, comment, seconds_spent, created_at, updated_at)
SELECT id, %(user)s, CASE WHEN id %% 500 = 0 THEN 'flag' ELSE 'rating' END,
       CASE WHEN id %% 500 = 0 THEN NULL ELSE 1.0 END, '', '', '', 3.0, %(now)s, %(now)s
FROM buffer_experience WHERE id %% 100 = 0
"""


def _sqlite_rows(runs: list, rows: int, full_arrays: bool, now):
    """GENERATE_SQL's rows, for INSERT_SQL (random() aside: a seeded generator here)."""
    draw = random.Random(0)
    pool = [
        " ".join(f"word{int(math.exp(draw.random() * math.log(VOCABULARY)))}" for _ in range(5 + (p * 31) % 21))
        for p in range(TEXT_POOL)
    ]
    sources = ["rollout", "rollout", "rollout", "expert", "synthetic"]
    statuses = ["ready", "ready", "consumed", "raw", "rejected"]
    prompt_ids = bytes.fromhex("07000000" * 24)
    for g in range(1, rows + 1):
        tokens = 16 + g % 200
        yield (
            runs[g % RUN_COUNT], g // 64, f"group-{g // 8}", g % 8, sources[g % 5], statuses[(g // 5) % 5],
            f"What is {g % 97} + {g % 89}? {pool[(g * 7) % TEXT_POOL][:40]}", pool[g % TEXT_POOL],
            prompt_ids, bytes.fromhex("2a000000" * tokens),
            bytes.fromhex("01" * tokens) if full_arrays else None,
            bytes.fromhex("cdcc4cbf" * tokens) if full_arrays else None,
            ((g * 7919) % 1000) / 1000.0, g // 6400, now,
        )


def generate_buffer(rows: int, user, *, full_arrays: bool = False) -> list:
    """`rows` experiences over RUN_COUNT new runs owned by `user`, feedback by `user` on 1% of
    them; the tables are analysed (and vacuumed, on Postgres). Responses are 16-215 tokens; with
    `full_arrays` they have an action mask and logprobs too. Returns the runs."""
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.buffer import search
    from apps.runs.models import Run

    runs = [Run.objects.create(name=f"bench-{i}", owner=user, config={}) for i in range(RUN_COUNT)]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            with transaction.atomic():  # one transaction, not one a row
                cursor.executemany(INSERT_SQL, _sqlite_rows([r.pk for r in runs], rows, full_arrays, now))
        else:
            cursor.execute(
                GENERATE_SQL,
                {
                    "runs": [r.pk for r in runs],
                    "run_count": RUN_COUNT,
                    "rows": rows,
                    "vocabulary": VOCABULARY,
                    "pool": TEXT_POOL,
                    "full_arrays": full_arrays,
                },
            )
        cursor.execute(FEEDBACK_SQL, {"user": user.pk, "now": now})
    search.catch_up(seconds=3600)  # the search documents, as the indexer's rounds would have made them
    with connection.cursor() as cursor:
        # As autovacuum would leave a live table: statistics for the planner, and the visibility
        # map that lets counts read the indexes alone. (VACUUM cannot run in a transaction.)
        if connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
        else:
            cursor.execute("VACUUM ANALYZE buffer_experience")
            cursor.execute("VACUUM ANALYZE feedback_feedback")
            cursor.execute("VACUUM ANALYZE buffer_experiencesearch")
    return runs


def changelist_cases(run) -> dict[str, str]:
    """The changelist URLs timed: the plain list, filters, searches, and the two together."""
    base = "/admin/buffer/experience/"
    return {
        "no filter": base,
        "run filter": f"{base}?run__id__exact={run.pk}",
        "run + status + search (common word)": f"{base}?run__id__exact={run.pk}&status__exact=ready&q=word3",
        "run + search (rare word)": f"{base}?run__id__exact={run.pk}&q=word900",
        "search (two words)": f"{base}?q=word2+word5",
        "reward range + has feedback": f"{base}?reward__gte=0.5&reward__lte=0.9&has_feedback=yes",
        "flagged": f"{base}?flagged=yes",
        "source + search + page 50": f"{base}?source__exact=expert&q=word4&p=50",
    }


def time_changelist(client, url: str, repeat: int) -> tuple[float, int, int]:
    """(median server seconds, queries, status) of GET url."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seconds, queries, status = [], 0, None
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            start = time.perf_counter()
            response = client.get(url)
            seconds.append(time.perf_counter() - start)
        queries, status = len(captured), response.status_code
    return statistics.median(seconds), queries, status


def create_bench_database(name: str) -> str:
    """A new database of its own (dropped by destroy_test_db), apart from the test suite's."""
    from django.db import connection

    connection.settings_dict["TEST"]["NAME"] = f"{connection.settings_dict['NAME']}_bench_{name}"
    return connection.creation.create_test_db(verbosity=0, autoclobber=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.test_settings")
    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from apps.accounts.roles import CURATOR
    from apps.accounts.services import create_user

    setup_test_environment()
    database = create_bench_database("changelist")
    try:
        curator = create_user("bench-curator", "bench-password-123", roles=[CURATOR])
        start = time.perf_counter()
        runs = generate_buffer(args.rows, curator)
        print(f"generated {args.rows:,} experiences in {time.perf_counter() - start:.1f} s (database {database})")
        client = Client()
        client.force_login(curator)
        print(f"{'changelist':42} {'server ms (median)':>18} {'queries':>8}")
        for name, url in changelist_cases(runs[0]).items():
            client.get(url)  # warm: the first request also loads templates and the session
            seconds, queries, status = time_changelist(client, url, args.repeat)
            assert status == 200, (url, status)
            print(f"{name:42} {seconds * 1000:18.0f} {queries:8d}")
    finally:
        connection.creation.destroy_test_db(database, verbosity=0)


if __name__ == "__main__":
    main()
