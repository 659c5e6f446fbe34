"""Multi-turn workflows: the trajectory's loss mask, step experiences and their advantages,
invalid actions, workflow settings. A scripted policy (a RolloutEngine that replies from a script
with the real tiny tokenizer) makes every token predictable; one test plays the real tiny model."""
import pytest
import torch

from workers.rft.algorithms.advantages import stepwise
from workers.rft.config import ConfigError
from workers.rft.engines import Completion, RolloutEngine, SamplingParams, TransformersEngine
from workers.rft.environments import ENVIRONMENTS, Step, TextEnvironment
from workers.rft.experience import Task
from workers.rft.explorer import Explorer
from workers.rft.memory import InMemoryBuffer, InMemoryTaskSource
from workers.rft.workflows import WORKFLOWS, workflow_args_problems
from workers.rft.workflows.base import TaskFailed

from .conftest import make_config


class ScriptedEngine(RolloutEngine):
    """Replies from a script: script(call, row, prompt_text) -> reply text. Each reply ends with
    eos (unless it is listed in `cut`, which ends it as if max_new_tokens cut it off); logprobs
    are -0.1 * (position + 1) so their alignment can be checked."""

    def __init__(self, tokenizer, script, cut=()):
        self.tokenizer, self.script, self.cut = tokenizer, script, set(cut)
        self.calls = []  # the prompts of each generate call

    def generate(self, prompts, params):
        call = len(self.calls)
        self.calls.append([self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts])
        out = []
        for row, text in enumerate(self.calls[-1]):
            reply = self.script(call, row, text)
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            stopped = reply not in self.cut
            ids = ids + [self.tokenizer.eos_token_id] if stopped else ids
            logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
            out.append([Completion(ids, reply, logprobs, "stop" if stopped else "length")] * params.n)
        return out

    def load_state_dict(self, state_dict, version):
        pass

    def load_checkpoint(self, path, version):
        pass


@ENVIRONMENTS.register("test-three-turns")
class ThreeTurns(TextEnvironment):
    """Three turns; the last reply 'good' earns 1. 'quit' ends the episode at once with 0."""

    instructions = "Talk to me three times."

    def reset(self, seed, task):
        self.turn = 0
        return "Turn 0 begins."

    def step(self, reply):
        self.turn += 1
        if reply == "quit":
            return Step("", 0.0, done=True)
        if self.turn == 3:
            return Step("", float(reply == "good"), done=True, success=reply == "good")
        return Step(f"Turn {self.turn} begins.")


def flow(engine, tokenizer, **args):
    return WORKFLOWS.get("multi_turn")(engine, None, tokenizer=tokenizer, **args)


def runs_of_ones(mask):
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for i, bit in enumerate(mask + [0]):
        if bit and start is None:
            start = i
        if not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("cut_second", [False, True])
def test_loss_mask_covers_exactly_the_models_tokens_in_a_three_turn_trajectory(tokenizer, cut_second):
    replies = ["alpha one", "beta two", "good"]
    engine = ScriptedEngine(tokenizer, lambda call, row, text: replies[call], cut=["beta two"] if cut_second else ())
    workflow = flow(engine, tokenizer, env="test-three-turns")
    (exp,) = workflow.run_batch([Task(id=7, prompt="")], SamplingParams(n=1, max_new_tokens=8), explorer_step=2)

    reply_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
    reply_ids = [ids if cut_second and i == 1 else ids + [tokenizer.eos_token_id] for i, ids in enumerate(reply_ids)]
    spans = runs_of_ones(exp.action_mask)
    # The 1s are exactly the three replies' tokens, in order; everything else is environment text.
    assert [exp.response_ids[s:e] for s, e in spans] == reply_ids
    assert spans == [tuple(span) for span in exp.metadata["turn_spans"]]
    assert sum(exp.action_mask) == sum(map(len, reply_ids)) < len(exp.response_ids)
    assert len(exp.response_ids) == len(exp.action_mask) == len(exp.logprobs)
    for s, e in spans:
        assert exp.logprobs[s:e] == pytest.approx([-0.1 * (i + 1) for i in range(e - s)])
    assert all(lp == 0.0 for lp, bit in zip(exp.logprobs, exp.action_mask) if not bit)
    # Environment tokens are the chat template's own rendering of the conversation.
    assert [m["role"] for m in exp.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert exp.messages[2]["content"] == "Turn 1 begins." and exp.messages[-1]["content"] == "good"
    full = tokenizer.decode(exp.prompt_ids + exp.response_ids, skip_special_tokens=False)
    rendered = tokenizer.apply_chat_template(exp.messages, tokenize=False)
    # A cut-off reply is closed with the eos the model did not write (masked out).
    assert full + "\n" == rendered
    # Each turn the model saw exactly the tokens it is trained on.
    assert engine.calls[2] == [
        tokenizer.decode(exp.prompt_ids + exp.response_ids[: spans[2][0]], skip_special_tokens=False)
    ]
    assert exp.reward == 1.0 and exp.reward_components == {"env_return": 1.0, "invalid_penalty": 0.0}
    assert exp.metadata["episode"] == {
        "return": 1.0, "success": 1.0, "turns": 3, "invalid_actions": 0, "finish": "done"
    }
    assert (exp.group_id, exp.rollout_index, exp.explorer_step) == ("2-7", 0, 2)


def test_real_model_trajectory_masks_its_own_tokens(tiny_model, tokenizer):
    engine = TransformersEngine(tiny_model, tokenizer)
    workflow = flow(engine, tokenizer, env="frozenlake", invalid_action="penalize", max_turns=3)
    experiences = workflow.run_batch([Task(id=1, prompt="")], SamplingParams(n=2, max_new_tokens=5, seed=0), 0)
    assert [e.rollout_index for e in experiences] == [0, 1]
    for exp in experiences:
        replies = [m["content"] for m in exp.messages if m["role"] == "assistant"]
        spans = runs_of_ones(exp.action_mask)
        assert len(spans) == len(replies) == exp.metadata["episode"]["turns"]
        assert [tokenizer.decode(exp.response_ids[s:e], skip_special_tokens=True) for s, e in spans] == replies
        assert len(exp.logprobs) == len(exp.response_ids) and all(lp < 0 for s, e in spans for lp in exp.logprobs[s:e])


def test_step_experiences_one_per_turn_with_the_final_reward(tokenizer):
    # Row 0 plays three turns ending 'good'; row 1 quits at once.
    engine = ScriptedEngine(tokenizer, lambda call, row, text: ["hello", "there", "good"][call] if row == 0 else "quit")
    workflow = flow(engine, tokenizer, env="test-three-turns", experience="step", max_turns=5)
    assert workflow.stepwise
    steps = workflow.run_batch([Task(id=4, prompt="")], SamplingParams(n=2, max_new_tokens=8), explorer_step=1)
    assert [(e.metadata["rollout"], e.metadata["turn"], e.rollout_index) for e in steps] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 5)
    ]
    assert [e.reward for e in steps] == [1.0, 1.0, 1.0, 0.0]
    assert ["episode" in e.metadata for e in steps] == [False, False, True, True]
    assert len({e.key for e in steps}) == 4  # every step keeps its own natural key
    first, second, third = steps[:3]
    # Each step's prompt is everything before its reply; its response is the reply alone.
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    after_first_prompt = second.prompt_ids[len(first.prompt_ids) :]
    assert after_first_prompt[: len(first.response_ids)] == first.response_ids
    assert all(e.action_mask == [1] * len(e.response_ids) for e in steps)
    assert tokenizer.decode(third.response_ids, skip_special_tokens=True) == "good"
    assert third.messages[-1] == {"role": "assistant", "content": "good"} and len(third.messages) == 6


def test_stepwise_advantages_on_a_hand_made_case():
    # Task A: episode 0 wins in 3 steps, episode 1 loses in 1. Task B: both episodes score 0.5.
    rewards = [1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    groups = ["A", "A", "A", "A", "B", "B", "B", "B"]
    episodes = [0, 0, 0, 1, 0, 0, 1, 1]
    advantages, metrics = stepwise("grpo", rewards, groups, episodes, epsilon=0.0)
    # Per episode: A's mean is 0.5 and sample std √½ (not the per-step mean 0.75) -> ±√½; B carries no signal.
    assert advantages.tolist() == pytest.approx([0.7071068, 0.7071068, 0.7071068, -0.7071068, 0, 0, 0, 0])
    assert metrics == {"zero_std_groups": 1, "compared_groups": 2, "zero_variance_groups": 0.5}
    rloo, _ = stepwise("rloo", rewards, groups, episodes)
    assert rloo.tolist() == [1.0, 1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="different rewards"):
        stepwise("grpo", [1.0, 0.0], ["A", "A"], [0, 0])


def test_explorer_broadcasts_episode_advantages_to_steps(tokenizer):
    config = make_config(
        explorer={"workflow": "multi_turn", "workflow_args": {"env": "test-three-turns", "experience": "step"}},
        algorithm={"repeat_times": 2},
    )
    # Rows are [task 0 rollout 0, task 0 rollout 1, task 1 rollout 0, ...]: every rollout 1 quits
    # at once, so from the second turn on only rollouts 0 are left.
    script = ["hi", "good"]
    engine = ScriptedEngine(
        tokenizer, lambda call, row, text: script[call - 1] if call else ("hi" if row % 2 == 0 else "quit")
    )
    workflow = WORKFLOWS.get("multi_turn")(engine, None, tokenizer=tokenizer, **config.explorer.workflow_args)
    buffer = InMemoryBuffer()
    tasks = InMemoryTaskSource([Task(id=i, prompt="") for i in range(4)])
    metrics = Explorer(config, workflow, tasks, buffer).explore_step()
    stored = buffer.all()
    assert len(stored) == 4 * (3 + 1) and metrics["written"] == 16
    for exp in stored:
        expected = 0.7071068 if exp.metadata["rollout"] == 0 else -0.7071068  # [1, 0]: ±0.5 / √½
        assert exp.advantage == pytest.approx(expected, abs=1e-4)
    # Metrics count episodes, not steps.
    assert metrics["episode/success"] == 0.5 and metrics["episode/turns"] == 2.0 and metrics["episode/return"] == 0.5


@pytest.mark.parametrize("mode", ["end", "penalize"])
def test_invalid_actions_end_or_penalise_as_configured(tokenizer, mode):
    script = ["jump!", "down", "down", "right", "down", "right", "right"]
    engine = ScriptedEngine(tokenizer, lambda call, row, text: script[call])
    workflow = flow(engine, tokenizer, env="frozenlake", invalid_action=mode, invalid_penalty=0.25)
    (exp,) = workflow.run_batch([Task(id=0, prompt="")], SamplingParams(n=1, max_new_tokens=8), 0)
    episode = exp.metadata["episode"]
    assert episode["invalid_actions"] == 1
    if mode == "end":
        assert episode == {"return": 0.0, "success": 0.0, "turns": 1, "invalid_actions": 1, "finish": "invalid_action"}
        assert exp.reward == -0.25 and len(exp.messages) == 2
    else:
        assert episode == {"return": 1.0, "success": 1.0, "turns": 7, "invalid_actions": 1, "finish": "done"}
        assert exp.reward == 0.75 and exp.reward_components == {"env_return": 1.0, "invalid_penalty": -0.25}
        # The environment said what went wrong and showed the unchanged board.
        assert exp.messages[2]["content"] == (
            "Invalid action. Reply with one of: left, down, right, up.\nPFFF\nFHFH\nFFFH\nHFFG"
        )


def test_turn_and_token_limits_end_episodes(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda call, row, text: "left")  # never reaches the goal
    (exp,) = flow(engine, tokenizer, env="frozenlake", max_turns=4).run_batch(
        [Task(id=0, prompt="")], SamplingParams(max_new_tokens=8), 0
    )
    assert exp.metadata["episode"]["finish"] == "max_turns" and exp.metadata["episode"]["turns"] == 4
    small = flow(engine, tokenizer, env="frozenlake", max_turns=50, max_tokens=200)
    (exp,) = small.run_batch([Task(id=0, prompt="")], SamplingParams(max_new_tokens=8), 0)
    assert exp.metadata["episode"]["finish"] == "max_tokens"
    assert len(exp.prompt_ids) + len(exp.response_ids) + 8 <= 200


def test_expert_episode_is_a_masked_trajectory(tokenizer):
    workflow = flow(None, tokenizer, env="frozenlake")
    expert = workflow.expert_experience(Task(id=3, prompt=""))
    replies = [m["content"] for m in expert.messages if m["role"] == "assistant"]
    assert replies == ["down", "down", "right", "down", "right", "right"]
    assert expert.source == "expert" and expert.reward == 1.0 and expert.metadata["episode"]["success"] == 1.0
    spans = runs_of_ones(expert.action_mask)
    assert [expert.response_ids[s:e] for s, e in spans] == [workflow.encode_response(r) for r in replies]
    with pytest.raises(TaskFailed, match="task 3: ValueError: no expert replies"):
        flow(None, tokenizer, env="frozenlake", env_args={"is_slippery": True}).expert_experience(Task(id=3, prompt=""))


@ENVIRONMENTS.register("test-heard")
class Heard(TextEnvironment):
    """Two turns; keeps every reply it acted on (`heard`, the whole test session's)."""

    instructions = "Say two things."
    heard = []

    def reset(self, seed, task):
        self.turn = 0
        return "Go on."

    def step(self, reply):
        Heard.heard.append(reply)
        self.turn += 1
        return Step("", 1.0, done=True) if self.turn == 2 else Step("Again.")


def test_an_expert_reply_cut_at_max_new_tokens_is_the_kept_text_everywhere_and_flagged(tokenizer):
    """An expert reply cut at explorer.max_new_tokens (encode_response): the environment acted on
    the whole reply, the conversation showed it, and its turn said "stop" without a stop token,
    where the trainer learns only its first tokens; nothing said it was cut."""
    long = "this reply runs on far past the few tokens a turn may have"
    workflow = flow(None, tokenizer, env="test-heard", max_response_tokens=4)
    Heard.heard.clear()
    expert = workflow.expert_experience(Task(id=5, prompt="", metadata={"expert_replies": [long, "yes"]}))
    kept = tokenizer(long, add_special_tokens=False)["input_ids"][:4]
    said = tokenizer.decode(kept)
    assert said != long and Heard.heard == [said, "yes"]
    assert [m["content"] for m in expert.messages if m["role"] == "assistant"] == [said, "yes"]
    spans = runs_of_ones(expert.action_mask)
    assert [expert.response_ids[s:e] for s, e in spans] == [kept, workflow.encode_response("yes")]
    assert expert.metadata["response_truncated"] is True
    # The cut turn is closed with the stop token it did not write, as the chat template renders it.
    full = tokenizer.decode(expert.prompt_ids + expert.response_ids, skip_special_tokens=False)
    assert full + "\n" == tokenizer.apply_chat_template(expert.messages, tokenize=False)
    whole = flow(None, tokenizer, env="test-heard", max_response_tokens=64).expert_experience(
        Task(id=5, prompt="", metadata={"expert_replies": [long, "yes"]}))
    assert Heard.heard[-2:] == [long, "yes"] and "response_truncated" not in whole.metadata


def test_workflow_settings_are_checked_by_name():
    assert workflow_args_problems("multi_turn", {"env": "frozenlake", "max_turns": 5}) == []
    problems = dict(workflow_args_problems("multi_turn", {"env": "lava", "max_turn": 5}))
    assert problems["max_turn"] == "unknown key; did you mean 'max_turns'?"
    # (other test modules register environments of their own: they follow the built-in ones)
    assert dict(workflow_args_problems("multi_turn", {"env": "lava"}))["env"].startswith(
        "unknown environment 'lava'; known: blackjack, cliffwalking, frozenlake, taxi, test-"
    )
    assert dict(workflow_args_problems("multi_turn", {})) == {"env": "required"}
    bad_types = dict(workflow_args_problems(
        "multi_turn", {"env": "taxi", "max_turns": "5", "invalid_penalty": True, "experience": "steps"}
    ))
    assert bad_types == {
        "max_turns": "expected an integer, got a string",
        "invalid_penalty": "expected a number, got a boolean",
        "experience": "'steps' is not one of: trajectory, step; did you mean 'step'?",
    }
    assert "unexpected keyword argument 'slippery'" in dict(
        workflow_args_problems("multi_turn", {"env": "frozenlake", "env_args": {"slippery": True}})
    )["env_args"]
    assert workflow_args_problems("single_turn", {"env": "taxi"}) == [("env", "unknown key; known keys: none")]
    # every setting is bounded before anything quotes it (a 70 KB name made a 70 KB message)
    assert workflow_args_problems("multi_turn", {"env": "x" * 70_000, "experience": "y" * 70_000}) == [
        ("env", "is more than 65536 characters long as JSON"),
        ("experience", "is more than 65536 characters long as JSON")]
    with pytest.raises(ConfigError, match=r"explorer\.workflow_args\.env: unknown environment 'lava'"):
        make_config(explorer={"workflow": "multi_turn", "workflow_args": {"env": "lava"}})
    with pytest.raises(ValueError, match="explorer.workflow_args.max_turns: must be >= 1, got 0"):
        WORKFLOWS.get("multi_turn")(None, None, tokenizer=object(), env="taxi", max_turns=0)


def test_workflow_run_is_deterministic_by_seed(tiny_model, tokenizer):
    engine = TransformersEngine(tiny_model, tokenizer)
    workflow = flow(engine, tokenizer, env="frozenlake", invalid_action="penalize", max_turns=2)
    runs = [
        workflow.run_batch([Task(id=1, prompt="")], SamplingParams(n=2, max_new_tokens=4, seed=5), 0) for _ in range(2)
    ]
    assert [e.response_ids for e in runs[0]] == [e.response_ids for e in runs[1]]
    assert torch.tensor(runs[0][0].logprobs).isfinite().all()


def test_rollout_browser_shows_episodes_turn_by_turn(tokenizer, researcher_client, researcher):
    """Through the Postgres buffer and the rollouts page: every turn, who spoke, the episode's facts."""
    from django.urls import reverse

    from apps.buffer.store import DjangoExperienceBuffer
    from apps.runs.models import Run

    script = ["jump", "down", "down", "right", "down", "right", "right"]
    engine = ScriptedEngine(tokenizer, lambda call, row, text: script[call])
    trajectory = flow(engine, tokenizer, env="frozenlake", invalid_action="penalize").run_batch(
        [Task(id=None, prompt="")], SamplingParams(max_new_tokens=8), 3
    )
    engine = ScriptedEngine(tokenizer, lambda call, row, text: script[call])
    steps = flow(engine, tokenizer, env="frozenlake", invalid_action="penalize", experience="step").run_batch(
        [Task(id=None, prompt="")], SamplingParams(max_new_tokens=8), 4
    )
    run = Run.objects.create(name="lake", owner=researcher, config={"trainer": {"total_steps": 10}})
    assert DjangoExperienceBuffer(run.pk).write(trajectory + steps) == 1 + 7

    html = researcher_client.get(reverse("run-rollouts", args=[run.pk])).content.decode()
    assert html.count('class="trajectory"') == 8
    assert html.count("<span class=\"chip good\">model</span>") == 7 + sum(range(1, 8))
    assert "Invalid action. Reply with one of: left, down, right, up." in html
    assert "7 turns" in html and ">success<" in html and "1 invalid action<" in html and "ended: done" in html
    assert "episode 0 · turn 7" in html
