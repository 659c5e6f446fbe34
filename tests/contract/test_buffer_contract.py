"""What workers/rft/protocols.py promises of an ExperienceBuffer and a TaskSource, asserted of
every implementation (conftest.py): the in-memory ones of the headless CLI and the Django ones of
the web app, on the database this run of the suite uses.

The tests sample as the trainer does: every sample is followed by mark_used before the next one
of the same sources. A second sample before mark_used is the Postgres buffer's own business: it
claims what it returns so that concurrent trainers never share a row (tests/apps/buffer)."""
import os
import threading
from dataclasses import replace

import pytest
from django.db import connection

from workers.rft.config import RunConfig
from workers.rft.experience import EXPERT_SOURCES, SOURCES, Task
from workers.rft.sampling import USUAL_SOURCES, apply_human_feedback

from .conftest import ENGINE, rollout

ALL = list(SOURCES)


def test_the_django_stores_run_on_the_database_url_engine(db):
    # The Makefile runs this directory once per engine: a settings change that silently pointed
    # both runs at one database would leave the other engine untested.
    scheme = os.environ.get("DATABASE_URL", "postgres://").split(":", 1)[0]
    expected = "sqlite" if scheme.startswith("sqlite") else "postgresql"
    assert connection.vendor == expected and ENGINE.startswith(expected)


# -- write, count, has_explorer_step ------------------------------------------------------------------


def test_a_replayed_explorer_step_writes_nothing_twice(harness):
    buffer, tasks = harness.buffer, harness.task_ids
    step = [rollout(t, step=0, index=i) for t in tasks for i in range(2)]
    assert buffer.write(step) == 8
    assert buffer.write(step) == 0
    assert buffer.write([*step[:3], rollout(tasks[0], step=0, index=2)]) == 1  # a partly stored step
    assert buffer.count(sources=["rollout"]) == 9


def test_a_replayed_step_stores_its_promoted_expert_copies_once(harness):
    """promote_to_expert's copies come in the step's write beside their rollouts: a replay (an
    explorer that died between writing and marking its groups done) stored them again."""
    from workers.rft.pipelines.experience_ops import promote_to_expert

    buffer, tasks = harness.buffer, harness.task_ids
    step, _ = promote_to_expert([rollout(t, index=i, reward=float(i)) for t in tasks[:2] for i in range(2)], None)
    assert buffer.write(step) == 6  # 4 rollouts, 2 copies of the ones scoring 1
    more, _ = promote_to_expert([rollout(tasks[2], index=1, reward=1.0)], None)
    assert buffer.write(step + more) == 2  # the new rollout and its copy only
    assert buffer.count(sources=["expert"]) == 3


def test_count_by_group_prefix(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0], source="expert", group_id="expert-1"), rollout(t[1], source="expert", group_id="x")])
    assert buffer.count(sources=["expert"], group_prefix="expert-") == 1
    assert buffer.count(sources=["expert"]) == 2


def test_a_replayed_step_of_rollouts_without_a_task_writes_nothing_twice(buffer):
    # Postgres's unique constraint never matches a NULL task: the store asks the table instead.
    step = [rollout(None, step=4, index=i) for i in range(3)]
    assert buffer.write(step) == 3
    assert buffer.write(step) == 0
    assert buffer.write([*step, rollout(None, step=4, index=3)]) == 1
    assert buffer.count(sources=["rollout"]) == 4


def test_a_batch_repeating_a_natural_key_stores_and_counts_it_once(buffer, harness):
    again = rollout(harness.task_ids[0], step=1)
    assert buffer.write([again, replace(again, response_ids=[5], action_mask=[1], logprobs=None)]) == 1
    assert buffer.count(sources=["rollout"]) == 1


def test_only_rollouts_are_deduplicated(buffer, harness):
    # Expert data, human edits and synthetic experiences have no natural key: each write stores.
    for source in ("expert", "human_edit", "synthetic"):
        exp = rollout(harness.task_ids[0], step=2, source=source)
        assert buffer.write([exp, exp]) == 2
        assert buffer.count(sources=[source]) == 2


def test_an_unknown_source_is_refused_and_nothing_is_stored(buffer, harness):
    with pytest.raises(ValueError, match="unknown experience source"):
        buffer.write([rollout(harness.task_ids[0]), rollout(harness.task_ids[1], source="oracle")])
    assert buffer.count(sources=ALL) == 0


def test_count_is_by_source_and_of_any_status(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0]), rollout(t[1]), rollout(t[0], source="expert"), rollout(t[0], source="synthetic")])
    assert buffer.count(sources=["rollout"]) == 2
    assert buffer.count(sources=["rollout", "synthetic"]) == 3
    assert buffer.count(sources=["human_edit"]) == 0
    buffer.mark_used(consumed=buffer.sample(10, sources=ALL))
    assert buffer.count(sources=ALL) == 4  # consumed ones still count


def test_has_explorer_step_means_the_step_s_rollouts_are_stored(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0], step=3), rollout(t[0], step=5, source="expert")])
    assert buffer.has_explorer_step(3)
    assert not buffer.has_explorer_step(4)
    assert not buffer.has_explorer_step(5)  # expert data at step 5 is not the explorer's step 5
    buffer.mark_used(consumed=buffer.sample(10, sources=ALL))
    assert buffer.has_explorer_step(3)  # still stored once trained on


# -- experiences read back as written -----------------------------------------------------------------


def test_every_field_reads_back_as_written(buffer, harness):
    t = harness.task_ids
    # Logprobs are stored as float32 in Postgres (apps/buffer/fields.py): these are exact there.
    written = [
        rollout(
            t[1], step=3, index=2, version=1, prompt_text="1+1?", response_text="2",
            messages=[{"role": "user", "content": "hi"}], logprobs=[-0.25, -1.5], reward=0.75,
            reward_components={"accuracy": 1.0}, advantage=-0.5, priority=2.0, use_count=0,
            metadata={"finish_reason": "stop", "nested": {"list": [1, "a", None]}},
        ),
        # A human edit has no logprobs (None, not []) and no reward; expert data may have no task.
        replace(rollout(t[2], step=4, version=2), source="human_edit", logprobs=None, reward=None, advantage=None),
        replace(rollout(None, step=0), source="expert", action_mask=[0, 1]),
        # An empty response: logprobs [] stays [], not None.
        replace(rollout(t[3], step=5), prompt_ids=[7], response_ids=[], action_mask=[], logprobs=[]),
    ]
    assert buffer.write(written) == 4
    read = buffer.sample(10, sources=ALL)
    assert len(read) == 4 and len({e.id for e in read}) == 4 and None not in {e.id for e in read}
    by_key = {(e.source, e.explorer_step): e for e in read}
    for exp in written:
        got = by_key[(exp.source, exp.explorer_step)]
        assert got == replace(exp, id=got.id)


# -- sample -------------------------------------------------------------------------------------------


def test_sample_is_least_used_first_then_oldest_step_then_id(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0], step=2), rollout(t[1], step=0), rollout(t[2], step=1), rollout(t[3], step=0)])
    first = buffer.sample(4, sources=["rollout"])
    assert [(e.explorer_step, e.task_id) for e in first] == [(0, t[1]), (0, t[3]), (1, t[2]), (2, t[0])]
    assert first[0].id < first[1].id
    buffer.mark_used(reused=first)
    oldest = buffer.sample(2, sources=["rollout"])
    buffer.mark_used(reused=oldest)
    again = buffer.sample(4, sources=["rollout"])
    assert [(e.explorer_step, e.use_count) for e in again] == [(1, 1), (2, 1), (0, 2), (0, 2)]


def test_priority_counts_as_uses_not_had(buffer, harness):
    """A curator's priority (the admin's action) moves a row ahead: priority 2 goes before the
    unused rows, and is reused twice more than them before it falls in line."""
    t = harness.task_ids
    buffer.write([rollout(t[0], source="expert", group_id=f"e{i}", rollout_index=i, priority=[0.0, 2.0][i])
                  for i in range(2)])
    order = []
    for _ in range(4):
        [e] = buffer.sample(1, sources=["expert"])
        buffer.mark_used(reused=[e])
        order.append(e.rollout_index)
    assert order == [1, 1, 0, 1]  # use_count - priority: -2 vs 0, -1 vs 0, 0 vs 0 (then by id), 0 vs 1


def test_expert_data_is_sampled_newest_first(buffer, harness):
    # Seeded expert rows are at step 0, a human edit at its rollout's step: newest first, the
    # edit trains within a step or two (apps/buffer/store.py). Ties by id.
    t = harness.task_ids
    buffer.write([rollout(t[i], source="expert") for i in range(3)])
    buffer.write([replace(rollout(t[0], step=7, source="human_edit"), logprobs=None)])
    got = buffer.sample(4, sources=EXPERT_SOURCES)
    assert [e.source for e in got] == ["human_edit", "expert", "expert", "expert"]
    assert [e.id for e in got[1:]] == sorted(e.id for e in got[1:])
    buffer.mark_used(reused=got)
    # Mixed with rollouts, the order is the rollouts' one: oldest first.
    buffer.write([rollout(t[1], step=3)])
    assert [e.explorer_step for e in buffer.sample(5, sources=["rollout", "human_edit"])] == [3, 7]


def test_sample_takes_only_the_sources_asked_for_and_at_most_n(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[i], index=j) for i in range(4) for j in range(2)])
    buffer.write([rollout(t[0], source="expert"), rollout(t[0], source="synthetic")])
    five = buffer.sample(5, sources=["rollout"])
    assert len(five) == 5 and {e.source for e in five} == {"rollout"}
    buffer.mark_used(consumed=five)
    assert len(buffer.sample(20, sources=["rollout"])) == 3
    assert sorted(e.source for e in buffer.sample(20, sources=["expert", "synthetic"])) == ["expert", "synthetic"]
    assert buffer.sample(0, sources=ALL) == [] and buffer.sample(5, sources=[]) == []


def test_sampling_changes_nothing(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0]), rollout(t[1], source="expert")])
    taken = buffer.sample(10, sources=ALL)
    assert buffer.count(sources=ALL) == 2
    buffer.mark_used(reused=taken)
    # The use mark_used counts is the only one: sampling itself counted none.
    assert sorted(e.use_count for e in buffer.sample(10, sources=ALL)) == [1, 1]


def test_stale_rollouts_and_synthetic_data_are_skipped_never_expert_or_human_data(buffer, harness):
    t = harness.task_ids
    assert buffer.write([]) == 0
    buffer.write(
        [rollout(t[i], step=i, version=1, source=s) for i, s in enumerate(SOURCES)]
        + [rollout(t[0], step=9, version=2), rollout(t[1], step=9, version=3, source="synthetic")]
    )
    fresh = buffer.sample(10, sources=ALL, min_model_version=2)
    assert sorted((e.source, e.model_version) for e in fresh) == [
        ("expert", 1), ("human_edit", 1), ("rollout", 2), ("synthetic", 3)
    ]
    buffer.mark_used(reused=fresh)
    assert len(buffer.sample(10, sources=ALL)) == 6  # stale ones are skipped, not dropped


def test_a_mix_sample_takes_what_its_two_samples_take(make_buffer):
    """sample_mix(n, n_expert) is sample(n) of the usual sources and sample(n_expert) of expert
    data, in their orders, stale rollouts skipped: the same rows as the two samples on a twin."""

    def fill(harness):
        t = harness.task_ids
        harness.buffer.write(
            [rollout(t[i % 4], step=i // 4, index=i, version=i // 4) for i in range(8)]
            + [rollout(t[0], step=5, source="synthetic", version=5)]
            + [rollout(t[i], source="expert") for i in range(3)]
            + [replace(rollout(t[1], step=6, source="human_edit"), logprobs=None)]
        )
        return harness.buffer

    def keys(experiences):
        return [(e.source, e.explorer_step, e.rollout_index) for e in experiences]

    mixed, twin = fill(make_buffer()), fill(make_buffer())
    usual, expert = mixed.sample_mix(4, 2, min_model_version=1)
    assert keys(usual) == keys(twin.sample(4, sources=USUAL_SOURCES, min_model_version=1))
    assert keys(expert) == keys(twin.sample(2, sources=EXPERT_SOURCES))
    assert keys(expert)[0] == ("human_edit", 6, 0) and {e.model_version for e in usual} >= {1}
    assert mixed.sample_mix(0, 0) == ([], [])


# -- mark_used ----------------------------------------------------------------------------------------


def test_consumed_experiences_leave_the_pool_and_reused_ones_stay(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0]), rollout(t[1]), rollout(t[2], source="expert")])
    [rollout_a, rollout_b] = buffer.sample(2, sources=["rollout"])
    [expert] = buffer.sample(1, sources=["expert"])
    buffer.mark_used(consumed=[rollout_a])
    buffer.mark_used(reused=[rollout_b, expert])
    assert [(e.id, e.use_count) for e in buffer.sample(10, sources=["rollout"])] == [(rollout_b.id, 1)]
    [expert_again] = buffer.sample(10, sources=["expert"])
    assert (expert_again.id, expert_again.use_count) == (expert.id, 1)
    buffer.mark_used(reused=[expert_again])
    assert buffer.sample(10, sources=["expert"])[0].use_count == 2


def test_one_call_marks_a_mix_steps_rollouts_consumed_and_its_expert_rows_reused(buffer, harness):
    t = harness.task_ids
    buffer.write([rollout(t[0]), rollout(t[1]), rollout(t[2], source="expert")])
    usual, expert = buffer.sample_mix(2, 1)
    buffer.mark_used(consumed=usual, reused=expert)
    assert buffer.sample(10, sources=["rollout"]) == []
    [again] = buffer.sample(10, sources=["expert"])
    assert (again.id, again.use_count) == (expert[0].id, 1)


# -- sample_pairs -------------------------------------------------------------------------------------


def test_pairs_are_least_used_first_and_sampling_them_counts_a_use(harness):
    buffer, t = harness.buffer, harness.task_ids
    assert buffer.sample_pairs(4) == []
    for i in range(2):
        chosen, rejected = rollout(t[i], index=0), rollout(t[i], index=1)
        harness.add_pair(replace(chosen, response_ids=[10 + i], action_mask=[1], logprobs=[-0.5]),
                         replace(rejected, response_ids=[20 + i], action_mask=[1], logprobs=[-0.5]))

    def seen(pairs):
        return [(p.task_id, p.prompt_ids, p.chosen_ids, p.rejected_ids) for p in pairs]

    first, second = buffer.sample_pairs(1), buffer.sample_pairs(1)
    assert seen(first) == [(t[0], [1, 2], [10], [20])]
    assert seen(second) == [(t[1], [1, 2], [11], [21])]
    assert [p.id for p in buffer.sample_pairs(5)] == [first[0].id, second[0].id]  # one use each: by age


def test_a_pair_used_max_uses_times_is_sampled_no_more(harness):
    """algorithm.dpo.max_pair_uses: the pairs used fewer times, however few, then none."""
    buffer, t = harness.buffer, harness.task_ids
    for i in range(2):
        harness.add_pair(rollout(t[i], index=0), rollout(t[i], index=1))
    first = buffer.sample_pairs(1, max_uses=2)
    assert len(buffer.sample_pairs(4, max_uses=2)) == 2  # the other's first use, this one's second
    assert [p.id for p in buffer.sample_pairs(4, max_uses=2)] != [first[0].id]
    assert buffer.sample_pairs(4, max_uses=2) == []
    assert len(buffer.sample_pairs(4)) == 2  # no limit: least used first, as before


def test_sampling_pairs_leaves_the_rollouts_use_counts_alone(harness):
    """A pair's use is the pair's: counted on its chosen rollout, it moved that rollout behind the
    run's others in its own (least used first) sampling."""
    buffer, t = harness.buffer, harness.task_ids
    chosen, rejected = rollout(t[0], index=0), rollout(t[0], index=1)
    buffer.write([chosen, rejected, rollout(t[1], step=1)])
    harness.add_pair(chosen, rejected)
    assert len(buffer.sample_pairs(1)) == 1
    assert [(e.task_id, e.use_count) for e in buffer.sample(3, sources=["rollout"])][0] == (t[0], 0)


# -- human feedback ---------------------------------------------------------------------------------


def test_a_rating_sets_the_reward_and_the_group_advantages_are_recomputed_over_the_whole_group(make_buffer):
    config = {"algorithm": {"name": "grpo", "repeat_times": 4}, "feedback": {"reward_mode": "override"}}
    harness = make_buffer(config)
    buffer, t = harness.buffer, harness.task_ids
    # One group of four at step 0; two rated. The batch holds two of them, the group all four.
    ratings = [1.0, None, 0.0, None]
    group = [
        rollout(t[0], index=i, reward=0.0, advantage=0.25, reward_components={"exact_match": 0.0}
                | ({} if r is None else {"human": r}))
        for i, r in enumerate(ratings)
    ]
    buffer.write(group)
    members = buffer.sample(4, sources=["rollout"])
    buffer.mark_used(reused=members)
    for m in members:  # as stored: sample gave its copies their feedback rewards, not the store
        m.reward, m.advantage = 0.0, 0.25
    batch = buffer.sample(2, sources=["rollout"])
    expected = [replace(e) for e in batch]
    apply_human_feedback(expected, {group[0].group_id: members}, RunConfig.from_dict(config))
    assert [(e.reward, e.advantage) for e in batch] == [(e.reward, e.advantage) for e in expected]
    assert batch[0].reward == 1.0 and batch[0].advantage > 0 and batch[1].reward == 0.5  # the unrated: the mean


def test_step_experiences_are_rated_and_compared_by_episode(make_buffer):
    """Two episodes of two steps in one group (experience: step), one step of each rated: every
    step trains with its episode's rating, and the two episodes are compared as two (±0.707), as
    docs/feedback.md says. The Postgres buffer read the group without its episodes: each step
    trained at the group's mean 0.5, the unrated ones with advantage 0."""
    config = {"algorithm": {"name": "grpo", "repeat_times": 2}, "feedback": {"reward_mode": "override"}}
    harness = make_buffer(config)
    t = harness.task_ids
    steps = [
        rollout(t[0], index=2 * episode + turn, reward=0.0, advantage=0.0, metadata={"rollout": episode},
                reward_components={} if turn else {"human": [1.0, 0.0][episode]})
        for episode in (0, 1) for turn in (0, 1)
    ]
    harness.buffer.write(steps)
    batch = harness.buffer.sample(4, sources=["rollout"])
    trained = sorted((e.rollout_index, e.reward, round(e.advantage, 3)) for e in batch)
    assert trained == [(0, 1.0, 0.707), (1, 1.0, 0.707), (2, 0.0, -0.707), (3, 0.0, -0.707)]


def test_a_rated_group_split_over_two_batches_trains_under_one_rule(make_buffer):
    """The batch holds only unrated members of a group whose other members are rated: they still
    train with the group's ratings (the group's mean, advantage 0 here), not the explorer's
    reward and advantage (the buffers looked only for ratings among the sampled rows)."""
    config = {"algorithm": {"name": "grpo", "repeat_times": 4}, "feedback": {"reward_mode": "override"}}
    harness = make_buffer(config)
    t = harness.task_ids
    rewards = [1.0, 1.0, 0.0, 0.0]  # what the reward fn gave; the explorer's advantages from them
    ratings = [None, None, 1.0, 1.0]
    harness.buffer.write([
        rollout(t[0], index=i, reward=r, advantage=[1.0, 1.0, -1.0, -1.0][i],
                reward_components={} if h is None else {"human": h})
        for i, (r, h) in enumerate(zip(rewards, ratings))
    ])
    first = harness.buffer.sample(2, sources=["rollout"])  # the unrated two, by id
    assert [e.rollout_index for e in first] == [0, 1]
    assert [(e.reward, e.advantage) for e in first] == [(1.0, 0.0), (1.0, 0.0)]


def test_without_a_reward_mode_ratings_change_nothing(buffer, harness):
    buffer.write([rollout(harness.task_ids[0], reward=0.0, advantage=0.25, reward_components={"human": 1.0})])
    [exp] = buffer.sample(1, sources=["rollout"])
    assert (exp.reward, exp.advantage) == (0.0, 0.25)


def test_human_edits_are_expert_data_unless_the_run_says_not(make_buffer):
    for edits_as_expert, expected in ((True, ["expert", "human_edit"]), (False, ["expert"])):
        harness = make_buffer({"algorithm": {"name": "sft"}, "feedback": {"edits_as_expert": edits_as_expert}})
        t = harness.task_ids
        edit = replace(rollout(t[1], source="human_edit"), logprobs=None)
        harness.buffer.write([rollout(t[0], source="expert"), edit])
        assert sorted(e.source for e in harness.buffer.sample(10, sources=EXPERT_SOURCES)) == expected


# -- two threads at once ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the threads' own connections see only what is committed
def test_an_explorer_and_a_trainer_thread_at_once_lose_nothing(harness):
    # The overlapped loop (loop.py): the explorer writes steps (and a restart may replay them)
    # while the trainer samples and consumes. Every rollout is written once and trained on once.
    buffer, t = harness.buffer, harness.task_ids
    steps = 12
    written, trained, errors = [], [], []
    explorers_done = threading.Event()

    def closing_connection(fn):
        def run():
            try:
                fn()
            except Exception as error:  # noqa: BLE001 - reported by the test below, not lost in a thread
                errors.append(error)
            finally:
                connection.close()  # this thread's own (Django): the test database is dropped at the end
        return run

    def explore():
        for step in range(steps):
            written.append(buffer.write([rollout(task, step=step, index=i) for task in t for i in range(2)]))

    def train():
        while True:
            done = explorers_done.is_set()
            batch = buffer.sample(5, sources=["rollout"])
            buffer.mark_used(consumed=batch)
            trained.extend(e.id for e in batch)
            if done and not batch:
                return

    explorers = [threading.Thread(target=closing_connection(explore)) for _ in range(2)]  # one is a replay
    trainer = threading.Thread(target=closing_connection(train))
    for thread in [*explorers, trainer]:
        thread.start()
    for thread in explorers:
        thread.join(timeout=60)
    explorers_done.set()
    trainer.join(timeout=60)
    assert not errors
    assert sum(written) == steps * 8 == buffer.count(sources=["rollout"])
    assert len(trained) == len(set(trained)) == steps * 8
    assert all(buffer.has_explorer_step(step) for step in range(steps))


# -- TaskSource ---------------------------------------------------------------------------------------


def tasks_as_values(tasks):
    return [(t.prompt, t.answer, t.metadata, t.difficulty, t.priority, t.times_sampled) for t in tasks]


def test_task_source_lists_marks_and_adds_tasks(make_task_source):
    given = [
        Task(None, "1+1?", "2", {"source": "gsm"}, difficulty=0.5, priority=1.0, times_sampled=3),
        Task(None, [{"role": "user", "content": "hi"}], "hello"),
    ]
    source = make_task_source(given)
    tasks = source.tasks()
    assert tasks_as_values(tasks) == tasks_as_values(given)
    a, b = (task.id for task in tasks)
    source.mark_sampled([a, b, a])  # an id listed twice counts twice
    assert [task.times_sampled for task in source.tasks()] == [5, 1]
    assert [task.times_sampled for task in tasks] == [3, 0]  # a list taken before is a snapshot
    added = source.add_tasks([Task(None, "2+2?", "4", difficulty=0.25)])
    assert len(added) == 1 and added[0].id not in (a, b) and added[0].id is not None
    assert tasks_as_values(added) == tasks_as_values([Task(None, "2+2?", "4", difficulty=0.25)])
    assert [task.id for task in source.tasks()] == [a, b, added[0].id]
    source.mark_sampled([added[0].id])
    assert source.tasks()[2].times_sampled == 1
    assert [task.id for task in source.tasks_with_ids([added[0].id, a])] == [added[0].id, a]  # in that order
    assert tasks_as_values(source.tasks_with_ids([b])) == tasks_as_values([source.tasks()[1]])
