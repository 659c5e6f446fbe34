import pytest

from workers.rft.experience import Experience, Task
from workers.rft.memory import InMemoryBuffer, InMemoryTaskSource, load_tasks
from workers.rft.pipelines import (
    EXPERIENCE_OPERATORS,
    TASK_OPERATORS,
    PipelineContext,
    build_operators,
    group_advantage,
    run_experience_operators,
    run_task_operators,
)


def exp(group, index, reward, response=(5, 2), text="x", finish="stop", task=None):
    return Experience(
        task_id=task if task is not None else hash(group) % 100, group_id=group, rollout_index=index,
        prompt_ids=[1], response_ids=list(response), action_mask=[1] * len(response), response_text=text,
        reward=reward, metadata={"finish_reason": finish},
    )


def run(specs, experiences, ctx=None):
    return run_experience_operators(build_operators(EXPERIENCE_OPERATORS, specs), experiences, ctx or PipelineContext())


def test_cleaning_operators_drop_and_count():
    batch = [exp("g", 0, 1.0), exp("g", 1, 0.0, text="  "), exp("g", 2, 0.0, finish="length"), exp("g", 3, 0.5)]
    kept, metrics = run(["drop_empty", "drop_truncated", {"name": "reward_filter", "min": 0.5}], batch)
    assert [e.rollout_index for e in kept] == [0, 3]
    assert metrics == {"drop_empty/dropped": 1, "drop_truncated/dropped": 1, "reward_filter/dropped": 0}


def test_group_std_filter_and_dedupe():
    batch = [
        exp("a", 0, 1.0), exp("a", 1, 1.0),
        exp("b", 0, 1.0, task=1), exp("b", 1, 0.0, (6, 2), task=1), exp("b", 2, 0.0, (6, 2), task=1),
    ]
    kept, _ = run(["group_std_filter"], batch)
    assert {e.group_id for e in kept} == {"b"}
    kept, metrics = run(["dedupe"], kept)
    assert [e.rollout_index for e in kept] == [0, 1] and metrics["dedupe/dropped"] == 1


def test_dedupe_keeps_the_same_reply_to_different_states():
    """A multi-turn episode's steps (experience: step): "down" in two states is two steps, not a
    duplicate (its key was the task and the response alone)."""
    first, later = exp("e", 0, 0.0, (7,), task=1), exp("e", 1, 1.0, (7,), task=1)
    later.prompt_ids = [1, 7, 9]  # the history so far, then the new state
    kept, metrics = run(["dedupe"], [first, later, exp("e", 2, 1.0, (7,), task=1)])
    assert [e.rollout_index for e in kept] == [0, 1] and metrics["dedupe/dropped"] == 1


def test_reward_shaping_keeps_the_raw_reward():
    [shaped], _ = run([{"name": "reward_shaping", "scale": 2.0, "length_penalty": 0.1, "truncation_penalty": 1}],
                      [exp("g", 0, 1.0, response=(1, 2, 3), finish="length")])
    assert shaped.reward == pytest.approx(2.0 - 0.3 - 1.0)
    assert shaped.reward_components["unshaped"] == 1.0


def test_promotion_copies_high_reward_rollouts_as_expert_data():
    batch = [exp("g", 0, 1.0), exp("g", 1, 0.0)]
    out, metrics = run([{"name": "promote_to_expert", "min_reward": 1.0}], batch)
    assert metrics["promote_to_expert/promoted"] == 1
    assert [e.source for e in out] == ["rollout", "rollout", "expert"]
    assert out[2].response_ids == out[0].response_ids and out[2].metadata["promoted_from"][2] == 0


def test_group_advantage_is_normalised_per_group_and_skips_expert_data():
    batch = [exp("a", 0, 1.0), exp("a", 1, 0.0), exp("b", 0, 0.0), exp("b", 1, 0.0), exp("e", 0, 1.0)]
    batch[-1].source = "expert"
    out, metrics = group_advantage(batch, PipelineContext(), fn="grpo", epsilon=1e-6)
    # group a [1, 0]: mean .5, sample std √½ -> ±√½
    assert [e.advantage for e in out[:4]] == pytest.approx([0.7071068, -0.7071068, 0.0, 0.0], abs=1e-5)
    assert out[4].advantage is None and metrics["zero_std_groups"] == 1
    out, metrics = group_advantage(batch, PipelineContext(), fn="grpo", drop_zero_std=True)
    assert [e.group_id for e in out] == ["a", "a", "e"] and metrics["zero_std_dropped"] == 2


def test_unknown_operator_is_named():
    with pytest.raises(KeyError, match="unknown experience operator 'nope'"):
        build_operators(EXPERIENCE_OPERATORS, ["nope"])


def test_task_filters_and_priority(tokenizer):
    from workers.rft.workflows import WORKFLOWS

    tasks = [
        Task(1, "What is 1 + 1?", difficulty=0.3),
        Task(2, "What is 12 + 34 plus a much longer text?", difficulty=1.5),
        Task(3, "What is 2 * 3?", difficulty=1.0, times_sampled=4),
    ]
    ctx = PipelineContext(
        workflow=WORKFLOWS.get("single_turn")(None, None, tokenizer=tokenizer, use_chat_template=False)
    )
    ops = build_operators(TASK_OPERATORS, [
        {"name": "filter_length", "max_tokens": 9},
        {"name": "filter_difficulty", "max": 1.2},
        {"name": "priority", "difficulty": 1.0, "use_count": 0.5},
    ])
    out = run_task_operators(ops, tasks, ctx)
    assert [t.id for t in out] == [1, 3]
    assert [t.priority for t in out] == pytest.approx([0.3, 1.0 - 2.0])


def test_synthesis_adds_harder_variants_of_solved_tasks_once():
    source = InMemoryTaskSource(load_tasks("arithmetic:n=4,max_operand=9,ops=+"))
    ctx = PipelineContext(task_source=source, seed=0, task_rewards={0: 1.0, 1: 0.0})
    ops = build_operators(TASK_OPERATORS, ["synthesize_harder"])
    out = run_task_operators(ops, source.tasks(), ctx)
    assert len(out) == 5 and out[-1].id == 4 and out[-1].metadata["harder_variant_of"] == 0
    parent = source.tasks()[0].metadata
    assert out[-1].metadata["a"] > 9 and out[-1].metadata["a"] // 10 == parent["a"]
    assert len(run_task_operators(ops, source.tasks(), ctx)) == 5  # already expanded


def test_memory_buffer_is_idempotent_and_samples_least_used_oldest_first():
    buffer = InMemoryBuffer()
    rollouts = [exp("0-1", i, 1.0, task=1) for i in range(3)]
    for i, e in enumerate(rollouts):
        e.model_version = i
    assert buffer.write(rollouts) == 3 and buffer.write(rollouts) == 0  # replayed step
    expert = [exp("x", 0, 1.0, task=9)]
    expert[0].source = "expert"
    buffer.write(expert)
    assert [e.rollout_index for e in buffer.sample(2, sources=["rollout"])] == [0, 1]
    assert [e.rollout_index for e in buffer.sample(5, sources=["rollout"], min_model_version=1)] == [1, 2]
    taken = buffer.sample(2, sources=["rollout"])
    buffer.mark_used(consumed=taken)
    assert [e.rollout_index for e in buffer.sample(5, sources=["rollout"])] == [2]
    [e] = buffer.sample(1, sources=["expert"], min_model_version=100)  # expert data never goes stale
    buffer.mark_used(reused=[e])
    assert buffer.sample(1, sources=["expert"])[0].use_count == 1


def test_taskset_specs_hold_out_an_eval_split():
    train = load_tasks("arithmetic:n=1000,max_operand=9,ops=+,split=train")
    held_out = load_tasks("arithmetic:n=1000,max_operand=9,ops=+,split=eval")
    assert len(train) + len(held_out) == 100 and 10 <= len(held_out) <= 30
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
    assert [t.id for t in train] == list(range(len(train)))


@pytest.mark.parametrize("tasks, pipeline, error", [
    ([], [], "the run's taskset (buffer.taskset) has no tasks: it was emptied or deleted"),
    (None, [{"name": "filter_difficulty", "min": 100}],
     "buffer.task_pipeline (filter_difficulty) left none of the taskset's 200 tasks: loosen its filters"),
])
def test_an_explorer_with_no_task_to_draw_says_why(tmp_path, tasks, pipeline, error):
    """A taskset deleted under a running run, or a task pipeline that filters every task out, failed
    the run with "max() arg is an empty sequence" from the engine (a review found it)."""
    import dataclasses

    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    from .conftest import make_config

    config = make_config(buffer={"taskset": "arithmetic:n=200,max_operand=9,ops=+", "task_pipeline": pipeline})
    stores = memory_stores(config)
    if tasks is not None:
        stores = dataclasses.replace(stores, task_source=InMemoryTaskSource(tasks))
    with Loop(config, stores, tmp_path) as loop, pytest.raises(ValueError) as raised:
        loop.explore()
    assert str(raised.value) == error


def test_an_eval_over_a_held_out_taskset_with_no_tasks_says_why(tmp_path):
    """Its tasks deleted under a training run, every eval after logged a held-out score of 0.0 over
    no tasks, nothing saying why."""
    import dataclasses

    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    from .conftest import make_config

    config = make_config(buffer={"taskset": "arithmetic:n=200,max_operand=9,ops=+",
                                 "eval_taskset": "arithmetic:n=200,max_operand=9,ops=+,split=eval"})
    stores = dataclasses.replace(memory_stores(config), eval_source=InMemoryTaskSource([]))
    with Loop(config, stores, tmp_path) as loop, pytest.raises(ValueError) as raised:
        loop.evaluate()
    assert str(raised.value) == ("the run's held-out taskset (buffer.eval_taskset) has no tasks: "
                                 "it was emptied or deleted")
