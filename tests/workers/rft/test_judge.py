"""Model rewards: the LLM judge (a scripted judge, then the tiny model as a real one) and a
sequence-classification reward model, both batched, with parse failures counted."""
import math

import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.experience import Task
from workers.rft.explorer import rollout_metrics
from workers.rft.rewards import build_reward
from workers.rft.rewards.models import DEFAULT_RUBRIC, LLMJudge, _judge, parse_score
from workers.rft.workflows import WORKFLOWS

from .test_multi_turn import ScriptedEngine


def test_scores_are_parsed_and_scaled():
    assert parse_score("Score: 8", 10) == 0.8
    assert parse_score("score = 3.5 out of 10", 10) == 0.35
    assert parse_score("I would say 7", 10) == 0.7  # no 'Score:', the last number
    assert parse_score("Score: 12", 10) is None  # out of range
    assert parse_score("great answer!", 10) is None


def test_scripted_judge_scores_a_batch_from_the_rubric(tokenizer):
    verdicts = {"Paris": "Score: 10", "Lyon": "Score: 2", "Rome?": "hmm, hard to say"}

    def judge(call, row, prompt):
        return next(v for response, v in verdicts.items() if f"Response: {response}\n" in prompt)

    engine = ScriptedEngine(tokenizer, judge)
    task = Task(id=1, prompt="What is the capital of France?", answer="Paris")
    scores, replies = LLMJudge(engine, tokenizer, batch_size=2).scores(
        ["Paris", "Lyon", "Rome?"], [task] * 3, DEFAULT_RUBRIC, 10
    )
    assert scores == [1.0, 0.2, None] and replies == ["Score: 10", "Score: 2", "hmm, hard to say"]
    # Two batches of at most two prompts, each the rubric filled in, in the judge's chat template.
    assert [len(call) for call in engine.calls] == [2, 1]
    prompt = engine.calls[0][0]
    assert prompt.startswith(
        "<|im_start|>user\nRate the response to the question below from 0 (wrong or unhelpful) to 10"
    )
    assert "Question: What is the capital of France?" in prompt and "Reference answer: Paris" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_llm_judge_reward_with_the_tiny_model_counts_parse_failures(tiny_path, tokenizer, monkeypatch):
    options = {"model": str(tiny_path), "max_new_tokens": 4, "batch_size": 4, "device": "cpu"}
    reward = build_reward({"llm_judge": options, "exact_match": 1.0})
    judge = _judge(str(tiny_path), "cpu", 4, 4)  # the instance the reward fn loaded once and keeps
    calls = []
    generate = judge.engine.generate
    monkeypatch.setattr(
        judge.engine, "generate", lambda prompts, params: calls.append(len(prompts)) or generate(prompts, params)
    )

    policy = TransformersEngine(judge.engine.model, tokenizer)  # any policy will do: the judge is the subject
    workflow = WORKFLOWS.get("single_turn")(policy, reward)
    tasks = [Task(id=i, prompt=f"What is {i} + 1?", answer=str(i + 1)) for i in range(3)]
    experiences = workflow.run_batch(tasks, SamplingParams(n=2, max_new_tokens=3, seed=0), 0)
    assert calls == [4, 2]  # six responses judged in batches of four, not one call each

    _, replies = judge.scores(
        [e.response_text for e in experiences], [t for t in tasks for _ in range(2)], DEFAULT_RUBRIC, 10
    )
    for exp, reply in zip(experiences, replies):
        parsed = parse_score(reply, 10)
        assert exp.reward_components["llm_judge_failed"] == float(parsed is None)
        assert exp.reward_components["llm_judge"] == (parsed or 0.0)
        assert exp.reward == pytest.approx(exp.reward_components["llm_judge"] + exp.reward_components["exact_match"])
    failures = sum(e.reward_components["llm_judge_failed"] for e in experiences)
    assert failures > 0  # a random tiny model rarely writes a score: the failures are counted...
    assert rollout_metrics(experiences)["llm_judge_failed"] == pytest.approx(failures / 6)  # ...and reach the metrics


def test_llm_judge_needs_a_model():
    with pytest.raises(TypeError, match="llm_judge.*missing a required argument: 'model'"):
        build_reward("llm_judge")


@pytest.fixture(scope="module")
def reward_model_dir(tiny_path, tmp_path_factory):
    """A one-label sequence classifier on the tiny backbone, saved like a real reward model."""
    from transformers import AutoModelForSequenceClassification

    from workers.rft.models import load_tokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_path, num_labels=1)
    path = tmp_path_factory.mktemp("reward-model")
    model.save_pretrained(path)
    load_tokenizer(tiny_path).save_pretrained(path)
    return path


def test_reward_model_scores_batches_like_single_responses(reward_model_dir):
    reward = build_reward(
        {"reward_model": {"model": str(reward_model_dir), "batch_size": 2, "device": "cpu", "weight": 0.5}}
    )
    task = Task(id=1, prompt="What is 2 + 2?", answer="4")
    responses = ["4", "The answer is 4, because two and two make four.", "five", ""]
    batched = reward.batch(responses, [task] * 4)
    single = [reward(response, task) for response in responses]
    for (total, parts), (_, one_parts) in zip(batched, single):
        # Padding in a batch does not change a score.
        assert parts["reward_model"] == pytest.approx(one_parts["reward_model"], abs=1e-4)
        assert total == pytest.approx(0.5 * parts["reward_model"]) and parts["reward_model_failed"] == 0.0
        assert math.isfinite(total)
    assert len({round(parts["reward_model"], 5) for _, parts in batched}) == 4
