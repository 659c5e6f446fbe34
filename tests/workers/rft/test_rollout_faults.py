"""What a step does with a task that fails, a cut-off tool call, an overlong prompt, and the metrics
and shaping of multi-turn episodes (per episode, the model's tokens). A scripted policy
(test_multi_turn.ScriptedEngine) with the real tiny tokenizer makes every token predictable."""
import logging

import pytest

from workers.rft.algorithms.advantages import stepwise
from workers.rft.engines import SamplingParams
from workers.rft.environments import ENVIRONMENTS, Step, TextEnvironment
from workers.rft.experience import Experience, Task
from workers.rft.explorer import Explorer
from workers.rft.memory import InMemoryBuffer, InMemoryTaskSource, load_tasks
from workers.rft.pipelines import (
    EXPERIENCE_OPERATORS,
    TASK_OPERATORS,
    PipelineContext,
    build_operators,
    run_experience_operators,
    run_task_operators,
)
from workers.rft.rewards import build_reward
from workers.rft.tools import TOOLS
from workers.rft.workflows import WORKFLOWS, TaskFailed

from .conftest import make_config
from .test_multi_turn import ScriptedEngine

WIN = ["down", "down", "right", "right", "down", "right"]  # FrozenLake 4x4 from its start to G


@ENVIRONMENTS.register("test-breaks-on")
class BreaksOn(TextEnvironment):
    """One turn; raises in reset or step for tasks whose metadata.breaks says so."""

    instructions = "Say anything."

    def reset(self, seed, task):
        self.task = task
        if task.metadata.get("breaks") == "reset":
            raise RuntimeError("no such level")
        return "Go."

    def step(self, reply):
        if self.task.metadata.get("breaks") == "step":
            raise KeyError("lost state")
        return Step("", 1.0, done=True, success=True)


def crashing_tool(key: str) -> str:
    """Raises what no tool should (a bug, not a refused call)."""
    raise RuntimeError(f"tool bug on {key}")


def multi_turn(engine, tokenizer, **args):
    return WORKFLOWS.get("multi_turn")(engine, None, tokenizer=tokenizer, **args)


def episode_config(experience, pipeline=(), **explorer):
    return make_config(
        algorithm={"repeat_times": 2},
        explorer={"batch_size": 1, "max_new_tokens": 8, "workflow": "multi_turn", "pipeline": list(pipeline),
                  "use_chat_template": True,
                  "workflow_args": {"env": "frozenlake", "experience": experience, "max_turns": 6}, **explorer},
    )


def frozenlake_explorer(tokenizer, config, script, cut=()):
    workflow = WORKFLOWS.get("multi_turn")(ScriptedEngine(tokenizer, script, cut=cut), None, tokenizer=tokenizer,
                                           **config.explorer.workflow_args)
    buffer = InMemoryBuffer()
    return Explorer(config, workflow, InMemoryTaskSource([Task(0, "", metadata={"seed": 0})]), buffer), buffer


# -- 1. reward shaping ---------------------------------------------------------------------------


def experience(reward, mask, finish="stop", **metadata):
    return Experience(task_id=0, group_id="0-0", rollout_index=0, prompt_ids=[1], response_ids=[2] * len(mask),
                      action_mask=mask, reward=reward, metadata={"finish_reason": finish, **metadata})


def shape(experiences, **params):
    ops = build_operators(EXPERIENCE_OPERATORS, [{"name": "reward_shaping", **params}])
    return run_experience_operators(ops, experiences, PipelineContext())[0]


def test_length_penalty_counts_only_the_models_tokens():
    # A won trajectory: 30 of its 170 tokens are the model's, the rest environment text.
    (won,) = shape([experience(1.0, [1] * 30 + [0] * 140)], length_penalty=0.01)
    assert won.reward == pytest.approx(1.0 - 0.3) and won.reward_components["unshaped"] == 1.0


def test_an_episodes_steps_are_shaped_as_one_and_keep_one_reward():
    # Episode 0: three steps (4 + 6 + 4 model tokens), its last reply cut off; episode 1: one step.
    steps = [experience(1.0, [1] * 4, rollout=0, turn=0), experience(1.0, [1] * 6, rollout=0, turn=1),
             experience(1.0, [1] * 4, "length", rollout=0, turn=2), experience(0.0, [1] * 13, rollout=1, turn=0)]
    shaped = shape(steps, length_penalty=0.01, truncation_penalty=0.5)
    assert [e.reward for e in shaped] == pytest.approx([1.0 - 0.14 - 0.5] * 3 + [-0.13])
    # stepwise (algorithms.advantages) requires one reward per episode: it raised on the old shaping.
    advantages, _ = stepwise("grpo", [e.reward for e in shaped], [e.group_id for e in shaped], [0, 0, 0, 1])
    assert advantages[0] == advantages[1] == advantages[2] > 0 > advantages[3]
    # An earlier step cut off, the last not: the episode ended well, no truncation penalty.
    mixed = shape([experience(1.0, [1] * 4, "length", rollout=0, turn=0), experience(1.0, [1] * 4, rollout=0, turn=1)],
                  truncation_penalty=0.5)
    assert [e.reward for e in mixed] == [1.0, 1.0]


def test_shaping_again_keeps_the_true_reward():
    once = shape([experience(1.0, [1] * 3)], offset=-0.5)
    twice = shape(once, offset=-0.5)
    assert twice[0].reward == 0.0 and twice[0].reward_components["unshaped"] == 1.0


@pytest.mark.parametrize("params", [{"length_penalty": 0.01}, {"truncation_penalty": 0.5}])
def test_step_mode_explorer_step_with_shaping(tokenizer, params):
    # Rollout 0 wins in six turns; rollout 1 moves right, cut off after the word, then left five times.
    config = episode_config("step", [{"name": "reward_shaping", **params}])
    explorer, buffer = frozenlake_explorer(
        tokenizer, config, lambda c, r, t: WIN[c] if r == 0 else ("Right" if c == 0 else "left"), cut=["Right"]
    )
    explorer.explore_step()  # raised "episode ('0-0', 0): its steps carry different rewards"
    stored = buffer.all()
    assert sorted({e.metadata["finish_reason"] for e in stored if e.metadata["rollout"] == 1}) == ["length", "stop"]
    for rollout in (0, 1):
        rewards = {e.reward for e in stored if e.metadata["rollout"] == rollout}
        assert len(rewards) == 1


# -- 2. one bad task -----------------------------------------------------------------------------


def test_a_seed_given_as_digits_is_the_seed(tokenizer):
    # A CSV's cells are text: gymnasium refused "17" (Seed must be a python integer).
    workflow = multi_turn(ScriptedEngine(tokenizer, None), tokenizer, env="blackjack")
    hands = {seed: workflow.start(Task(1, "", metadata={"seed": seed}), 0).messages[-1]["content"]
             for seed in ("17", 17, " 17 ")}
    assert len(set(hands.values())) == 1


@pytest.mark.parametrize("seed", ["17.5", 42.5, -1, True, [1, 2]])
def test_a_bad_seed_fails_its_task_alone(tokenizer, seed):
    engine = ScriptedEngine(tokenizer, lambda c, r, t: "down")
    workflow = multi_turn(engine, tokenizer, env="frozenlake", max_turns=2)
    tasks = [Task(3, "", metadata={"seed": seed}), Task(4, "", metadata={"seed": 0})]
    failed = {}
    experiences = workflow.run_batch(tasks, SamplingParams(n=2, max_new_tokens=4), 0, failed=failed)
    assert [e.task_id for e in experiences] == [4, 4]
    assert str(failed[3]).startswith("task 3: ValueError: metadata.seed must be an integer >= 0")
    with pytest.raises(TaskFailed, match="task 3: .*metadata.seed"):
        workflow.run_batch(tasks, SamplingParams(n=1, max_new_tokens=4), 0)


@pytest.mark.parametrize("breaks", ["reset", "step"])
def test_an_environment_that_raises_fails_its_task_alone(tokenizer, breaks):
    engine = ScriptedEngine(tokenizer, lambda c, r, t: "hi")
    workflow = multi_turn(engine, tokenizer, env="test-breaks-on")
    failed = {}
    tasks = [Task(1, "", metadata={"breaks": breaks}), Task(2, "")]
    experiences = workflow.run_batch(tasks, SamplingParams(n=2, max_new_tokens=4), 0, failed=failed)
    assert [e.task_id for e in experiences] == [2, 2] and list(failed) == [1]
    assert str(failed[1]) == ("task 1: RuntimeError: no such level" if breaks == "reset"
                              else "task 1: KeyError: 'lost state'")


def test_a_tool_that_crashes_fails_its_task_alone(tokenizer, monkeypatch):
    monkeypatch.setitem(TOOLS._entries, "test_crashing_tool", crashing_tool)  # only here: others list the tools
    call = '<tool_call>{"name": "test_crashing_tool", "arguments": {"key": "x"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, lambda c, r, t: call if r == 0 else "4")
    workflow = WORKFLOWS.get("tool_calling")(engine, build_reward("exact_match"), tokenizer=tokenizer,
                                             tools=["test_crashing_tool"])
    failed = {}
    experiences = workflow.run_batch([Task(1, "q", "4"), Task(2, "q", "4")], SamplingParams(max_new_tokens=32), 0,
                                     failed=failed)
    assert [e.task_id for e in experiences] == [2] and str(failed[1]) == "task 1: RuntimeError: tool bug on x"


def broken_on_task_1(response, task):
    if task.id == 1:
        raise ZeroDivisionError("bad answer key")
    return 1.0, {"ok": 1.0}


def test_single_turn_drops_the_task_whose_reward_fn_raises(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda c, r, t: "4")
    workflow = WORKFLOWS.get("single_turn")(engine, broken_on_task_1, tokenizer=tokenizer)
    failed = {}
    experiences = workflow.run_batch([Task(1, "a"), Task(2, "b")], SamplingParams(n=2, max_new_tokens=4), 0,
                                     failed=failed)
    assert [e.task_id for e in experiences] == [2, 2] and str(failed[1]) == "task 1: ZeroDivisionError: bad answer key"


def single_turn_explorer(tokenizer, reward, tasks, claims=None):
    config = make_config(algorithm={"repeat_times": 2}, explorer={"batch_size": len(tasks), "max_new_tokens": 4})
    workflow = WORKFLOWS.get("single_turn")(ScriptedEngine(tokenizer, lambda c, r, t: "4"), reward, tokenizer=tokenizer,
                                            use_chat_template=False)
    buffer = InMemoryBuffer()
    return Explorer(config, workflow, InMemoryTaskSource(tasks), buffer, claims=claims), buffer


def test_explorer_step_goes_on_without_a_failed_task(tokenizer, caplog):
    explorer, buffer = single_turn_explorer(tokenizer, broken_on_task_1, [Task(1, "a"), Task(2, "b")])
    with caplog.at_level(logging.WARNING, logger="workers.rft.explorer"):
        metrics = explorer.explore_step()
    assert metrics["failed_tasks"] == 1 and metrics["rollouts"] == 2 and metrics["written"] == 2
    assert {e.task_id for e in buffer.all()} == {2}
    warnings = [r.getMessage() for r in caplog.records if r.name == "workers.rft.explorer"]
    assert warnings == ["explorer step 0: task 1: ZeroDivisionError: bad answer key (its rollouts are left out)"]
    assert all(t.times_sampled == 1 for t in explorer.task_source.tasks())  # not picked first again and again


def test_a_step_whose_every_task_failed_fails_the_run(tokenizer):
    def broken(response, task):
        raise ZeroDivisionError("bad answer key")

    explorer, buffer = single_turn_explorer(tokenizer, broken, [Task(1, "a"), Task(2, "b")])
    with pytest.raises(RuntimeError, match="every task failed; the first: task [12]: ZeroDivisionError"):
        explorer.explore_step()
    assert buffer.all() == []


class OneExplorerClaims:
    """protocols.StepClaims for one explorer: it claims every group, then finishes the step."""

    def __init__(self):
        self.task_ids, self.parts, self.claimed = None, [], False

    def open(self, step, select):
        self.task_ids = self.task_ids or select()
        return self.task_ids

    def claim(self, step):
        mine, self.claimed = ([] if self.claimed else list(self.task_ids)), True
        return mine

    def done(self, step, task_ids, part):
        self.parts.append(part | {"worker": "w", "explorer": "explorer"})

    def finish(self, step, then):
        then(self.parts)
        return True


def test_a_shared_step_whose_every_task_failed_fails_the_run(tokenizer):
    def broken(response, task):
        raise ZeroDivisionError("bad answer key")

    explorer, _ = single_turn_explorer(tokenizer, broken, [Task(1, "a"), Task(2, "b")], claims=OneExplorerClaims())
    assert explorer.explore_step() == {"groups": 2}  # its share alone does not decide
    with pytest.raises(RuntimeError, match="step 0: every task failed; the first: task [12]: ZeroDivisionError"):
        explorer.explore_step()
    partly, _ = single_turn_explorer(tokenizer, broken_on_task_1, [Task(1, "a"), Task(2, "b")],
                                     claims=OneExplorerClaims())
    partly.explore_step()
    assert partly.explore_step()["failed_tasks"] == 1


# -- 3. cut-off and unclosed tool calls ----------------------------------------------------------

CUT_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "84'


def tool_episode(tokenizer, replies, cut=(), reward_fn="exact_match", answer="84", **args):
    engine = ScriptedEngine(tokenizer, lambda c, r, t: replies[c], cut=cut)
    workflow = WORKFLOWS.get("tool_calling")(engine, build_reward(reward_fn), tokenizer=tokenizer, **args)
    (exp,) = workflow.run_batch([Task(5, "What is 12 * 7?", answer)], SamplingParams(max_new_tokens=24), 0)
    return exp


@pytest.mark.parametrize("reply, cut", [
    (CUT_CALL, True),  # max_new_tokens ended the reply inside the call: it scored 1.0 as the answer
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "80+4"}}', False),  # never closed
    ("84 <tool_ca", True),  # cut off in the tag itself
])
def test_an_unfinished_tool_call_is_an_invalid_action(tokenizer, reply, cut):
    exp = tool_episode(tokenizer, [reply], cut=[reply] if cut else ())
    assert exp.metadata["episode"]["finish"] == "invalid_action" and exp.metadata["episode"]["invalid_actions"] == 1
    assert exp.reward == 0.0 and "exact_match" not in exp.reward_components
    penalised = tool_episode(tokenizer, [reply, "84"], cut=[reply] if cut else (), invalid_action="penalize")
    error = penalised.messages[2]["content"]
    assert '"error": "<tool_call>' in error or "cut off" in error
    assert penalised.reward == 1.0 and penalised.metadata["episode"]["turns"] == 2


def test_a_complete_call_before_an_unclosed_one_runs_and_reports_both(tokenizer):
    reply = ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call> '
             '<tool_call>{"name": "calculator"')
    exp = tool_episode(tokenizer, [reply, "4"], answer="4", invalid_action="penalize")
    assert exp.messages[2]["content"] == (
        '<tool_response>{"name": "calculator", "content": "4"}</tool_response>\n'
        '<tool_response>{"name": null, "error": "<tool_call> without </tool_call>"}</tool_response>'
    )


def test_success_means_the_answer_was_right(tokenizer):
    spec = {"exact_match": 1.0, "format": 0.5}
    wrong = tool_episode(tokenizer, ["<answer>85</answer>"], reward_fn=spec)
    assert wrong.reward == 0.5 and wrong.metadata["episode"]["success"] == 0.0  # was 1: reward > 0
    right = tool_episode(tokenizer, ["<answer>84</answer>"], reward_fn=spec)
    assert right.metadata["episode"]["success"] == 1.0


# -- 4. metrics per episode ----------------------------------------------------------------------


@pytest.mark.parametrize("experience_kind", ["trajectory", "step"])
def test_metrics_and_task_rewards_are_per_episode(tokenizer, experience_kind):
    # Rollout 0 reaches G in six moves, rollout 1 falls into the hole on its second.
    config = episode_config(experience_kind)
    explorer, _ = frozenlake_explorer(tokenizer, config, lambda c, r, t: WIN[c] if r == 0 else ["down", "right"][c])
    metrics = explorer.explore_step()
    # step mode averaged over 8 steps: 0.75; the episodes' mean is 0.5
    assert metrics["reward_mean"] == metrics["episode/return"] == 0.5 and metrics["rollouts"] == 2
    assert explorer.ctx.task_rewards[0] == 0.5
    # The model's tokens (each reply and its eos), not the boards in between.
    replies = WIN + ["down", "right"]
    assert metrics["response_length"] == sum(len(tokenizer(r)["input_ids"]) + 1 for r in replies) / 2
    assert metrics["truncated_frac"] == 0.0 and metrics["prompt_truncated"] == 0.0


def test_reward_components_are_averaged_over_every_episode(tokenizer):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    config = make_config(algorithm={"repeat_times": 2}, explorer={
        "batch_size": 1, "max_new_tokens": 32, "workflow": "tool_calling", "workflow_args": {"max_turns": 2},
        "reward_fn": {"exact_match": 1.0, "format": 0.5}})
    # Rollout 0 calls the tool until max_turns (no answer, no components); rollout 1 answers.
    engine = ScriptedEngine(tokenizer, lambda c, r, t: call if r == 0 or c == 0 else "<answer>4</answer>")
    workflow = WORKFLOWS.get("tool_calling")(engine, build_reward(config.explorer.reward_fn), tokenizer=tokenizer,
                                             **config.explorer.workflow_args)
    metrics = Explorer(config, workflow, InMemoryTaskSource([Task(0, "What is 2+2?", "4")]), InMemoryBuffer()
                       ).explore_step()
    assert metrics["exact_match"] == 0.5 and metrics["format"] == 0.5  # both were missing


# -- 5. overlong prompts -------------------------------------------------------------------------


def test_an_overlong_chat_prompt_keeps_its_template_head(tokenizer):
    # tiny's Taxi opening is 270 tokens; model.max_prompt_tokens is 256 by default.
    workflow = multi_turn(ScriptedEngine(tokenizer, None), tokenizer, env="taxi")
    whole = multi_turn(ScriptedEngine(tokenizer, None), tokenizer, env="taxi", max_prompt_tokens=1000)
    task = Task(0, "", metadata={"seed": 0})
    episode, full = workflow.start(task, 0), whole.start(task, 0)
    assert len(full.prompt_ids) == 270 and not full.prompt_truncated
    assert len(episode.prompt_ids) == 256 and episode.prompt_truncated
    text = tokenizer.decode(episode.prompt_ids, skip_special_tokens=False)
    # The left cut began 'his 5x5 map (|': the user header was gone.
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert text.endswith(tokenizer.decode(full.prompt_ids[-100:], skip_special_tokens=False))
    # Without a chat template there is no head to keep: the prompt keeps its end.
    plain = WORKFLOWS.get("single_turn")(None, None, tokenizer=tokenizer, use_chat_template=False, max_prompt_tokens=5)
    prompt = plain.encode_prompt([{"role": "user", "content": "one two three four five six seven eight"}])
    assert prompt.truncated and tokenizer.decode(prompt.ids) == tokenizer.decode(
        tokenizer("one two three four five six seven eight")["input_ids"][-5:])


def test_a_cut_prompt_is_counted_and_logged_once_per_task(tokenizer, caplog):
    config = make_config(algorithm={"repeat_times": 2}, explorer={
        "batch_size": 1, "max_new_tokens": 8, "workflow": "multi_turn", "use_chat_template": True,
        "workflow_args": {"env": "taxi", "max_turns": 1}})
    workflow = WORKFLOWS.get("multi_turn")(ScriptedEngine(tokenizer, lambda c, r, t: "south"), None,
                                           tokenizer=tokenizer, **config.explorer.workflow_args)
    explorer = Explorer(config, workflow, InMemoryTaskSource([Task(0, "", metadata={"seed": 0})]), InMemoryBuffer())
    with caplog.at_level(logging.WARNING, logger="workers.rft.workflows.base"):
        first, second = explorer.explore_step(), explorer.explore_step()
    assert first["prompt_truncated"] == second["prompt_truncated"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "workers.rft.workflows.base"]
    assert warnings == ["task 0: its prompt is 270 tokens, over model.max_prompt_tokens (256): the model reads it "
                        "with the start of its text cut off"]


# -- 6. synthesize_harder after a filter ---------------------------------------------------------


def test_synthesize_harder_expands_each_task_once_behind_a_filter():
    source = InMemoryTaskSource(load_tasks("arithmetic:n=8,max_operand=9"))
    hardest = max(t.difficulty for t in source.tasks())
    ops = build_operators(TASK_OPERATORS, [{"name": "filter_difficulty", "max": hardest},
                                           {"name": "synthesize_harder", "min_reward": 1.0, "max_new": 2}])
    ctx = PipelineContext(task_source=source, task_rewards={t.id: 1.0 for t in source.tasks()})
    for _ in range(3):
        run_task_operators(ops, source.tasks(), ctx)
    parents = [t.metadata["harder_variant_of"] for t in source.tasks() if "harder_variant_of" in t.metadata]
    assert len(parents) == len(set(parents)) == 6  # was [0, 0, 0, 1, 1, 1]


# -- 7. plain prompts, expert replies ------------------------------------------------------------


def test_without_a_chat_template_every_turn_ends_as_the_first(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda c, r, t: ["down", "down", "right"][c])
    workflow = multi_turn(engine, tokenizer, env="frozenlake", max_turns=3, use_chat_template=False)
    workflow.run_batch([Task(0, "", metadata={"seed": 0})], SamplingParams(n=1, max_new_tokens=8), 0)
    boards = ["PFFF\nFHFH\nFFFH\nHFFG", "SFFF\nPHFH\nFFFH\nHFFG", "SFFF\nFHFH\nPFFH\nHFFG"]
    assert [prompts[0].endswith(board) for prompts, board in zip(engine.calls, boards)] == [True] * 3
    assert engine.calls[1][0].endswith("<|im_end|>\n\n" + boards[1])


def test_expert_replies_must_be_a_list(tokenizer):
    workflow = multi_turn(None, tokenizer, env="frozenlake")
    with pytest.raises(TaskFailed, match="task 1: ValueError: metadata.expert_replies must be a list"):
        workflow.expert_experience(Task(1, "", metadata={"expert_replies": "down", "seed": 0}))
    expert = workflow.expert_experience(Task(1, "", metadata={"expert_replies": WIN, "seed": 0}))
    assert expert.metadata["episode"]["success"] == 1.0
