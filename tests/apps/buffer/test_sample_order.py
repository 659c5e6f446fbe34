"""What a trainer's sample takes, checked against a plain-Python reading of the rule
(apps/buffer/store.py `_sampleable`, and workers.rft.sampling.sample_key's order) over a varied
buffer, and under 8 samplers at once on their own connections: the claiming statement must hand out exactly the
rows, in exactly the order, that the rule names, and never one row twice."""
import random
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.buffer.models import Experience as ExperienceRow
from apps.buffer.store import DjangoExperienceBuffer
from apps.runs.models import Run
from workers.rft.experience import EXPERT_SOURCES, SOURCES

STALE = ("rollout", "synthetic")


def fill(runs, rows_per_run=120, seed=0):
    """Rows of every source and status, few distinct use counts and steps (ties down to the id),
    stale versions, claimed rows, rated and unrated rollouts, spread over `runs`."""
    rng = random.Random(seed)
    rows = []
    for run in runs:
        for i in range(rows_per_run):
            rows.append(ExperienceRow(
                run=run, source=rng.choice(SOURCES), rollout_index=i, group_id=f"g{i // 4}",
                status=rng.choice(["ready"] * 6 + ["consumed", "rejected", "raw"]),
                use_count=rng.randrange(3), explorer_step=rng.randrange(5), model_version=rng.randrange(5),
                priority=rng.choice([0.0] * 4 + [1.0, 2.5]),
                claimed_at=timezone.now() - timedelta(minutes=1) if rng.random() < 0.1 else None,
                reward_components={"exact_match": 1.0} | ({"human": 0.5} if rng.random() < 0.4 else {}),
                prompt_ids=[1, 2], response_ids=[3, 4, i], action_mask=[1, 1, 1], logprobs=[-0.5, -0.25, -1.0],
            ))
    rng.shuffle(rows)  # ids do not follow the sort keys
    ExperienceRow.objects.bulk_create(rows)


def expected(run, sources, min_model_version, n):
    """The rule, read off every row of the table in Python."""
    feedback = run.config.get("feedback", {})
    source_runs = feedback.get("source_runs", [])
    if not feedback.get("edits_as_expert", True):
        sources = [s for s in sources if s != "human_edit"]
    newest_first = set(sources) <= set(EXPERT_SOURCES)

    def sampleable(row):
        return (
            (row.run_id == run.pk or (row.run_id in source_runs and row.source == "human_edit"))
            and row.status == "ready" and row.source in sources and row.claimed_at is None
            and not (row.source in STALE and min_model_version is not None and row.model_version < min_model_version)
            and not (feedback.get("rated_only") and row.source in STALE and "human" not in row.reward_components)
        )

    rows = [row for row in ExperienceRow.objects.all() if sampleable(row)]
    rows.sort(key=lambda r: (r.use_count - r.priority, -r.explorer_step if newest_first else r.explorer_step, r.pk))
    return [row.pk for row in rows[:n]]


MIX = {"algorithm": {"name": "mix"}, "buffer": {"expert_taskset": "gold"}}
CONFIGS = [
    {},
    {"feedback": {"source_runs": "OTHER"}},
    {"feedback": {"source_runs": "OTHER", "rated_only": True, "rating_wait_s": 0}},
    {"feedback": {"edits_as_expert": False}},  # with source runs: refused, it leaves them nothing to give
]
SOURCE_SETS = [["rollout"], ["rollout", "synthetic", "human_edit"], list(EXPERT_SOURCES), ["human_edit"], list(SOURCES)]


@pytest.mark.parametrize("config", CONFIGS, ids=["plain", "source-runs", "rated-only", "no-edits"])
def test_sample_takes_the_rows_the_rule_names_in_its_order(researcher, config):
    run, other, unrelated = (Run.objects.create(name=name, owner=researcher, config={}) for name in "abc")
    if config:  # a mix run: it reads rollouts, expert data and the feedback keys that choose them
        feedback = config["feedback"]
        config = {**MIX, "feedback": feedback | ({"source_runs": [other.pk]} if "source_runs" in feedback else {})}
    run.config = config
    run.save()
    fill([run, other, unrelated])
    if connection.vendor == "postgresql":  # a plan whose RETURNING comes in the table's order, not the pick's
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_nestloop = off")
    claimed_before = set(ExperienceRow.objects.filter(claimed_at__isnull=False).values_list("pk", flat=True))
    checked = 0
    for sources in SOURCE_SETS:
        for min_model_version in (None, 2):
            for n in (1, 7, 1000):
                want = expected(run, sources, min_model_version, n)
                got = DjangoExperienceBuffer(run.pk).sample(n, sources=sources, min_model_version=min_model_version)
                assert [e.id for e in got] == want, (sources, min_model_version, n)
                claimed = set(ExperienceRow.objects.filter(claimed_at__isnull=False).values_list("pk", flat=True))
                assert claimed == claimed_before | set(want)  # it claims what it returns, nothing else
                ExperienceRow.objects.filter(pk__in=want).update(claimed_at=None)  # the next case starts as this one
                checked += len(want)
    assert checked > 200  # the cases did take rows: an empty answer everywhere would agree with itself


def test_a_sampled_row_reads_back_with_its_fields(researcher):
    run = Run.objects.create(name="a", owner=researcher, config={})
    fill([run], rows_per_run=30)
    [row] = ExperienceRow.objects.filter(pk=expected(run, ["rollout"], None, 1)[0])
    [got] = DjangoExperienceBuffer(run.pk).sample(1, sources=["rollout"])
    assert (got.id, got.use_count, got.explorer_step, got.group_id, got.reward_components) == (
        row.pk, row.use_count, row.explorer_step, row.group_id, row.reward_components
    )
    arrays = (got.prompt_ids, got.response_ids, got.action_mask, got.logprobs)
    assert [list(a) for a in arrays] == [row.prompt_ids, row.response_ids, row.action_mask, row.logprobs]
    if connection.vendor == "postgresql":  # numpy arrays, views of one buffer a column (SQLite: lists)
        assert [a.dtype.str for a in arrays] == ["<i4", "<i4", "|u1", "<f4"]


@pytest.mark.django_db(transaction=True)  # each sampler's own connection sees what is committed
def test_eight_samplers_at_once_share_out_exactly_the_ready_rows(researcher):
    if connection.vendor != "postgresql":  # embedded SQLite: one writer at a time (its in-memory test
        pytest.skip("database locks a second thread out); tests/contract runs threads on it")
    run = Run.objects.create(name="a", owner=researcher, config={})
    fill([run], rows_per_run=800, seed=1)
    ready = set(expected(run, ["rollout", "synthetic"], None, 10**6))
    assert len(ready) > 200
    taken, errors = [], []
    start = threading.Barrier(8)

    def sampler():
        try:
            buffer = DjangoExperienceBuffer(run.pk)
            start.wait()
            while batch := buffer.sample(5, sources=["rollout", "synthetic"]):
                keys = [(e.use_count - e.priority, e.explorer_step, e.id) for e in batch]
                assert keys == sorted(keys)  # each batch in the sampling order
                taken.extend(e.id for e in batch)
        except Exception as error:  # noqa: BLE001 - reported by the test, not lost in a thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=sampler) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert len(taken) == len(set(taken))  # no row handed out twice
    assert set(taken) == ready  # and together exactly the ready rows


def test_a_claim_is_a_hot_update(researcher):
    """Claiming changes no indexed value and computes no text (migration 0006): Postgres keeps the
    new row version on its page with no index entries (a HOT update). Before, `claimed_at` was in
    the sample-order index's condition and every claim wrote into every index of the table."""
    if connection.vendor != "postgresql":
        pytest.skip("HOT updates are Postgres's")
    run = Run.objects.create(name="a", owner=researcher, config={})
    fill([run], rows_per_run=200)

    def hot_updates():  # this transaction's own counts, current at once
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_hot_updated('buffer_experience'::regclass)")
            return cursor.fetchone()[0]

    # A row whose page has no room left for its new version is not HOT (the table's fillfactor of
    # 90 leaves room for a few per page, and pruning frees more between steps): most are, where
    # before none was.
    before = hot_updates()
    got = DjangoExperienceBuffer(run.pk).sample(20, sources=["rollout", "synthetic"])
    assert len(got) == 20
    assert hot_updates() - before >= 15
