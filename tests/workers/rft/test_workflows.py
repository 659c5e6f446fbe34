import pytest

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.experience import Task
from workers.rft.rewards import build_reward
from workers.rft.workflows import WORKFLOWS, Workflow


@pytest.fixture
def engine(tiny_model, tokenizer):
    return TransformersEngine(tiny_model, tokenizer)


def tasks():
    return [Task(id=10, prompt="What is 2 + 2?", answer="4"), Task(id=11, prompt="What is 3 + 4?", answer="7")]


def workflow(engine, **options):
    return WORKFLOWS.get("single_turn")(engine, build_reward("exact_match"), **options)


def test_single_turn_scores_every_rollout_of_every_task(engine, tokenizer):
    engine.model_version = 3
    experiences = workflow(engine).run_batch(tasks(), SamplingParams(n=3, max_new_tokens=5, seed=0), explorer_step=7)
    assert [(e.task_id, e.rollout_index) for e in experiences] == [(10, 0), (10, 1), (10, 2), (11, 0), (11, 1), (11, 2)]
    assert {e.group_id for e in experiences} == {"7-10", "7-11"}
    for e in experiences:
        assert e.source == "rollout" and e.explorer_step == 7 and e.model_version == 3
        assert len(e.response_ids) == len(e.action_mask) == len(e.logprobs) and all(e.action_mask)
        assert e.prompt_text.startswith("<|im_start|>user\nWhat is")
        assert e.prompt_text.endswith("<|im_start|>assistant\n")
        assert e.prompt_ids == tokenizer(e.prompt_text, add_special_tokens=False)["input_ids"]
        assert e.messages[-1] == {"role": "assistant", "content": e.response_text}
        assert e.reward == e.reward_components["exact_match"] in (0.0, 1.0)
        assert e.metadata["finish_reason"] in ("stop", "length")


def test_reward_comes_from_the_reward_fn(engine):
    seen = []

    def reward(response, task):
        seen.append((response, task.id))
        return 0.5, {"half": 0.5}

    experiences = WORKFLOWS.get("single_turn")(engine, reward).run_batch(
        tasks()[:1], SamplingParams(n=2, max_new_tokens=3, seed=0), 0
    )
    assert [e.reward for e in experiences] == [0.5, 0.5]
    assert seen == [(e.response_text, 10) for e in experiences]


def test_system_prompt_and_plain_prompts(engine):
    chat = workflow(engine, system_prompt="You are a helpful assistant.")
    messages = chat.messages(tasks()[0])
    assert messages[0] == {"role": "system", "content": "You are a helpful assistant."}
    assert chat.encode_prompt(messages)[0].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    plain = workflow(engine, use_chat_template=False)
    assert plain.encode_prompt(plain.messages(tasks()[0]))[0] == "What is 2 + 2?"
    # A task given as chat messages keeps them.
    chat_task = Task(id=1, prompt=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert chat.messages(chat_task)[0]["content"] == "Be brief."


def test_long_prompts_keep_their_end(engine):
    # 5 tokens leave the chat template's head and end no room for the text: the prompt keeps its end.
    short = workflow(engine, max_prompt_tokens=5)
    text, ids, truncated = short.encode_prompt(short.messages(tasks()[0]))
    assert len(ids) == 5 and ids[-3:] == short.tokenizer(text, add_special_tokens=False)["input_ids"][-3:]
    assert truncated and not workflow(engine).encode_prompt(short.messages(tasks()[0])).truncated


def test_expert_experience_is_formatted_like_a_rollout(engine, tokenizer):
    flow = workflow(engine)
    task = tasks()[1]
    expert = flow.expert_experience(task)
    assert expert.source == "expert" and expert.reward == 1.0 and expert.response_text == "7"
    assert expert.prompt_ids == flow.encode_prompt(flow.messages(task))[1]
    assert expert.response_ids == tokenizer("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    written = Task(id=2, prompt="What is 3 + 4?", answer="7", metadata={"expert_response": "<answer>7</answer>"})
    assert flow.expert_experience(written).response_text == "<answer>7</answer>"


def test_base_workflow_runs_task_by_task(engine):
    class Echo(Workflow):
        def run(self, task, params, explorer_step):
            return [task.id] * params.n

    assert Echo(engine, None).run_batch(tasks(), SamplingParams(n=2), 0) == [10, 10, 11, 11]
    assert "single_turn" in WORKFLOWS


def test_an_imported_response_is_formatted_like_a_rollout_of_its_prompt(engine, tokenizer):
    flow = workflow(engine, system_prompt="Be brief.")
    task = Task(id=3, prompt="What is 3 + 4?", answer="7")
    expert, imported = flow.expert_experience(task), flow.written_experience("What is 3 + 4?", "7")
    assert (imported.prompt_ids, imported.response_ids, imported.messages) == (
        expert.prompt_ids, expert.response_ids, expert.messages)
    assert imported.prompt_text.startswith("<|im_start|>system\nBe brief.")
    assert imported.source == "expert" and imported.reward is None and imported.task_id is None
    # A chat prompt with its own system turn keeps it; the run's is not added.
    chat = flow.written_experience([{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi"}], "Hey")
    assert [m["content"] for m in chat.messages] == ["Terse.", "Hi", "Hey"] and "Be brief" not in chat.prompt_text
    assert "prompt_truncated" not in chat.metadata
    cut = workflow(engine, max_prompt_tokens=8).written_experience("word " * 50, "ok")
    assert len(cut.prompt_ids) == 8 and cut.metadata["prompt_truncated"]


def test_the_headless_cli_says_an_expert_dataset_is_the_web_apps(tmp_path, capsys):
    import json

    from workers.rft.__main__ import main
    from workers.rft.config import RunConfig

    path = tmp_path / "sft.json"
    path.write_text(json.dumps(RunConfig.from_dict(
        {"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_dataset": "expert"}}).to_dict()))
    assert main(["run", str(path)]) == 2
    assert "buffer.expert_dataset names imported expert data of the web app's buffer" in capsys.readouterr().err
