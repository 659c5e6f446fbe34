"""The engine's buffer protocol over Postgres."""
from dataclasses import replace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.buffer import store
from apps.buffer.models import Experience as ExperienceRow
from apps.buffer.store import DjangoExperienceBuffer
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset
from workers.rft.experience import Experience


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


@pytest.fixture
def task_ids(db):
    taskset = Taskset.objects.create(name="ts")
    return [Task.objects.create(taskset=taskset, index=i, prompt=f"{i}+1?", answer=str(i + 1)).pk for i in range(4)]


def rollout(task_id, step=0, index=0, version=0, **fields):
    return Experience(task_id=task_id, group_id=f"{step}-{task_id}", rollout_index=index, prompt_ids=[1, 2],
                      response_ids=[3, 4], action_mask=[1, 1], explorer_step=step, model_version=version, **fields)


def test_write_is_idempotent_per_natural_key(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    step = [rollout(t, index=i) for t in task_ids for i in range(2)]
    assert buffer.write(step) == 8
    assert buffer.write(step) == 0
    assert buffer.has_explorer_step(0) and not buffer.has_explorer_step(1)
    assert ExperienceRow.objects.filter(run=run).count() == 8


def test_every_field_reads_back_as_written(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    written = rollout(
        task_ids[1], step=3, index=2, version=1, prompt_text="1+1?", response_text="2",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=[-0.25, -1.5], reward=0.75, reward_components={"accuracy": 1.0}, advantage=-0.5, priority=2.0,
        metadata={"finish_reason": "stop"},
    )
    buffer.write([written])
    [row] = ExperienceRow.objects.filter(run=run)
    assert store.to_experience(row) == replace(written, id=row.pk)
    assert row.status == "ready" and row.created_at is not None


def test_a_concurrent_replay_of_the_same_step_wins_harmlessly(run, task_ids, monkeypatch):
    # Another worker replaying step 0 stores one of its rollouts after this write looked for them.
    buffer = DjangoExperienceBuffer(run.pk)
    step = [rollout(t) for t in task_ids]
    real_insert = store.insert

    def insert_after_the_other_writer(experiences, run_id):
        if not ExperienceRow.objects.filter(run=run).exists():
            ExperienceRow.objects.bulk_create([store.to_row(step[0], run_id)])
        return real_insert(experiences, run_id)

    monkeypatch.setattr(store, "insert", insert_after_the_other_writer)
    buffer.write(step)
    assert sorted(ExperienceRow.objects.filter(run=run).values_list("task_id", flat=True)) == sorted(task_ids)


def test_generated_nul_bytes_are_stored(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(task_ids[0], response_text="a\x00b", metadata={"raw": "\x00"})])
    row = ExperienceRow.objects.get(run=run)
    assert row.response_text == "a\ufffdb" and row.metadata == {"raw": "\ufffd"}
    assert row.response_ids == [3, 4]


def test_sample_claims_rows_so_two_trainers_never_share_one(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(t, index=i) for t in task_ids for i in range(2)])
    first = buffer.sample(5, sources=["rollout"])
    second = DjangoExperienceBuffer(run.pk).sample(5, sources=["rollout"])
    assert len(first) == 5 and len(second) == 3
    assert not {e.id for e in first} & {e.id for e in second}


@pytest.mark.postgres("one claiming statement (FOR UPDATE SKIP LOCKED); SQLite claims under its one write lock")
def test_a_mix_sample_claims_both_parts_in_one_statement(run, task_ids, monkeypatch):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(t, index=i) for t in task_ids for i in range(2)])
    buffer.write([rollout(t, source="expert") for t in task_ids])
    buffer.config  # noqa: B018 (read once, not counted below)
    statements, compile_claim = [], store.claim_statement
    monkeypatch.setattr(store, "claim_statement",
                        lambda picks, claimer: statements.append(picks) or compile_claim(picks, claimer))
    # One claim (on its own cursor, which Django does not count) and its transaction: no other query.
    with CaptureQueriesContext(connection) as queries:
        usual, expert = buffer.sample_mix(3, 2)
    assert all("SAVEPOINT" in q["sql"] for q in queries.captured_queries), queries.captured_queries
    assert [len(picks) for picks in statements] == [2]
    assert len(usual) == 3 and len(expert) == 2
    assert ExperienceRow.objects.filter(run=run, claimed_at__isnull=False).count() == 5
    other_usual, other_expert = DjangoExperienceBuffer(run.pk).sample_mix(10, 10)
    assert len(other_usual) == 2 * len(task_ids) - 3 and len(other_expert) == len(task_ids) - 2
    assert not {e.id for e in usual + expert} & {e.id for e in other_usual + other_expert}


def test_staleness_and_consumption(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(task_ids[0], step=0, version=0), rollout(task_ids[1], step=1, version=3)])
    fresh = buffer.sample(10, sources=["rollout"], min_model_version=2)
    assert [e.model_version for e in fresh] == [3]
    buffer.mark_used(consumed=fresh)
    assert [e.model_version for e in buffer.sample(10, sources=["rollout"])] == [0]  # the consumed one is gone


def test_rewind_gives_back_what_lost_steps_consumed(run, task_ids):
    from django.utils import timezone

    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(t) for t in task_ids])
    early = buffer.sample(2, sources=["rollout"])
    buffer.mark_used(consumed=early)
    checkpoint_time = timezone.now()
    late = buffer.sample(2, sources=["rollout"])
    buffer.mark_used(consumed=late)
    assert buffer.rewind(checkpoint_time) == 2
    back = buffer.sample(10, sources=["rollout"])
    assert {e.id for e in back} == {e.id for e in late}
    assert all(e.use_count == 0 for e in back)


def test_a_flag_made_while_a_step_holds_the_row_keeps_it_out_of_training(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(t) for t in task_ids])
    taken = buffer.sample(2, sources=["rollout"])
    ExperienceRow.objects.filter(pk=taken[0].id).update(status=ExperienceRow.Status.REJECTED)  # the annotator's flag
    buffer.mark_used(consumed=taken)
    statuses = dict(ExperienceRow.objects.filter(pk__in=[e.id for e in taken]).values_list("pk", "status"))
    assert statuses == {taken[0].id: "rejected", taken[1].id: "consumed"}
    assert buffer.rewind(None) == 1  # a resumed run gives back the consumed row only
    assert taken[0].id not in {e.id for e in buffer.sample(10, sources=["rollout"])}


def test_a_mix_steps_rows_are_marked_in_one_statement(run, task_ids):
    """Its rollouts consumed (a flagged one stays rejected), its expert rows reused: one UPDATE."""
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([rollout(t) for t in task_ids] + [replace(rollout(t, index=1), source="expert") for t in task_ids])
    usual, expert = buffer.sample_mix(2, 2)
    ExperienceRow.objects.filter(pk=usual[0].id).update(status=ExperienceRow.Status.REJECTED)
    with CaptureQueriesContext(connection) as queries:
        buffer.mark_used(consumed=usual, reused=expert)
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["UPDATE"]
    marked = ExperienceRow.objects.filter(pk__in=[e.id for e in usual + expert])
    rows = {pk: (status, uses, consumed_at is not None, claimed_at) for pk, status, uses, consumed_at, claimed_at
            in marked.values_list("pk", "status", "use_count", "consumed_at", "claimed_at")}
    assert rows == {
        usual[0].id: ("rejected", 1, True, None), usual[1].id: ("consumed", 1, True, None),
        expert[0].id: ("ready", 1, True, None), expert[1].id: ("ready", 1, True, None),
    }


def test_rewind_gives_back_the_uses_lost_steps_made_of_expert_rows(run, task_ids):
    """A MIX step reuses expert rows (they stay ready): a resume takes back the lost steps' uses,
    so the replayed steps sample the same expert rows first again."""
    from django.utils import timezone

    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([replace(rollout(t), source="expert", group_id=f"expert-{t}") for t in task_ids])
    early = buffer.sample(2, sources=["expert"])
    buffer.mark_used(reused=early)
    checkpoint_time = timezone.now()
    late = buffer.sample(2, sources=["expert"])
    buffer.mark_used(reused=late)
    buffer.rewind(checkpoint_time)
    uses = dict(ExperienceRow.objects.filter(run=run).values_list("pk", "use_count"))
    assert uses == {e.id: 1 for e in early} | {e.id: 0 for e in late}
    assert {e.id for e in buffer.sample(2, sources=["expert"])} == {e.id for e in late}
    buffer.rewind(None)  # from the start: every use given back
    assert set(ExperienceRow.objects.filter(run=run).values_list("use_count", flat=True)) == {0}


def test_a_fresh_human_edit_is_sampled_before_the_seeded_expert_rows(run, task_ids):
    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([replace(rollout(t), source="expert", group_id=f"expert-{t}") for t in task_ids])
    edit = replace(rollout(task_ids[0], step=7), source="human_edit", logprobs=None)
    buffer.write([edit])
    [first] = buffer.sample(1, sources=["expert", "human_edit"])
    assert first.source == "human_edit"


def test_a_restart_releases_what_its_trainer_held_of_another_runs_edits_and_nothing_else(researcher, task_ids):
    """Run B trains on run A's human edits (feedback.source_runs). B's trainer dies holding one:
    B's restart releases it, and A's restart leaves B's live claim alone. The restart released the
    rows its own run owned: A's edit stayed claimed for ever, for A and B alike."""
    a = Run.objects.create(name="a", owner=researcher, config={})
    b = Run.objects.create(name="b", owner=researcher,
                           config={"mode": "train", "algorithm": {"name": "sft"}, "feedback": {"source_runs": [a.pk]}})
    edits = [replace(rollout(t), source="human_edit", logprobs=None) for t in task_ids[:2]]
    DjangoExperienceBuffer(a.pk).write(edits)
    [held] = DjangoExperienceBuffer(b.pk).sample(1, sources=["human_edit"])  # then B's worker dies
    [a_holds] = DjangoExperienceBuffer(a.pk).sample(1, sources=["human_edit"])  # A's live step
    assert DjangoExperienceBuffer(a.pk).rewind(None) == 1  # A restarts: its own claim only
    assert ExperienceRow.objects.get(pk=held.id).claimed_by == b.pk
    assert DjangoExperienceBuffer(b.pk).rewind(None) == 1  # B restarts
    assert {e.id for e in DjangoExperienceBuffer(a.pk).sample(2, sources=["human_edit"])} == {held.id, a_holds.id}


def test_deleting_a_run_releases_what_its_trainer_held_of_other_runs(researcher, task_ids):
    from apps.runs.deletion import delete_runs

    a = Run.objects.create(name="a", owner=researcher, config={})
    b = Run.objects.create(name="b", owner=researcher, status=Run.Status.FAILED,
                           config={"mode": "train", "algorithm": {"name": "sft"}, "feedback": {"source_runs": [a.pk]}})
    DjangoExperienceBuffer(a.pk).write([replace(rollout(task_ids[0]), source="human_edit", logprobs=None)])
    [held] = DjangoExperienceBuffer(b.pk).sample(1, sources=["human_edit"])
    delete_runs([b])
    assert [e.id for e in DjangoExperienceBuffer(a.pk).sample(1, sources=["human_edit"])] == [held.id]


def test_a_pair_of_episodes_keeps_their_masks_so_dpo_weighs_only_the_models_turns(run, task_ids, annotator):
    """Two multi-turn episodes compared: DPO trained their environment turns as the policy's."""
    from apps.feedback.models import Feedback

    buffer = DjangoExperienceBuffer(run.pk)
    buffer.write([replace(rollout(task_ids[0], index=i), response_ids=[3, 4, 5], action_mask=mask)
                  for i, mask in enumerate(([1, 0, 1], [1, 1, 0]))])
    chosen, rejected = ExperienceRow.objects.filter(run=run).order_by("rollout_index")
    Feedback.objects.create(experience=chosen, other=rejected, user=annotator, kind=Feedback.Kind.PREFERENCE,
                            value=1.0)
    [pair] = buffer.sample_pairs(1)
    assert [list(e.action_mask) for e in pair.as_experiences()] == [[1, 0, 1], [1, 1, 0]]
