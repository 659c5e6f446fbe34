"""Tools and the tool-calling workflow: the calculator, the call format, a full round trip."""
import json

import pytest

from workers.rft.engines import SamplingParams
from workers.rft.experience import Task
from workers.rft.rewards import build_reward
from workers.rft.tools import TOOLS, ToolError, calculator, call, describe
from workers.rft.workflows import WORKFLOWS, workflow_args_problems
from workers.rft.workflows.tool_calling import parse_tool_calls

from .test_multi_turn import ScriptedEngine, runs_of_ones


def test_calculator_evaluates_arithmetic_and_refuses_the_rest():
    assert calculator("12 * 7") == "84"
    assert calculator("(1 + 2) ** 3 - 10 / 4") == "24.5"
    assert calculator("-3 // 2 + 7 % 4") == "1"
    assert calculator("6 / 3") == "2"
    for bad, message in [
        ("__import__('os')", "not arithmetic"), ("2 +", "cannot parse"), ("9 ** 999", "too large"),
        ("x" * 300, "at most 200"),
    ]:
        with pytest.raises(ToolError, match=message):
            calculator(bad)
    with pytest.raises(ToolError, match="division by zero"):
        call("calculator", {"expression": "1 / 0"})
    with pytest.raises(ToolError, match="missing a required argument: 'expression'"):
        call("calculator", {"expr": "1"})
    with pytest.raises(ToolError, match="unknown tool 'search'"):
        call("search", {})
    assert describe("calculator") == (
        "calculator(expression: str): Evaluate an arithmetic expression with + - * / // % ** and parentheses."
    )
    assert "calculator" in TOOLS


def test_tool_calls_are_parsed_from_a_reply():
    reply = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
        " and <tool_call>{oops}</tool_call>"
    )
    parsed = parse_tool_calls(reply)
    assert parsed[0] == ("calculator", {"expression": "2+3"})
    assert parsed[1].startswith("not JSON")
    assert parse_tool_calls("The answer is 5.") == []
    assert parse_tool_calls('<tool_call>["calculator"]</tool_call>') == [
        'expected {"name": <tool>, "arguments": {...}}'
    ]


def tool_flow(engine, tokenizer, **args):
    return WORKFLOWS.get("tool_calling")(engine, build_reward("exact_match"), tokenizer=tokenizer, **args)


def test_tool_call_round_trip(tokenizer):
    call_text = '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'
    replies = [call_text, "84"]
    engine = ScriptedEngine(tokenizer, lambda n, row, text: replies[n])
    workflow = tool_flow(engine, tokenizer)
    (exp,) = workflow.run_batch(
        [Task(id=1, prompt="What is 12 * 7?", answer="84")], SamplingParams(max_new_tokens=64), 0
    )

    # The model was told the tools and the format, then saw the tool's result before answering.
    first_prompt, second_prompt = engine.calls[0][0], engine.calls[1][0]
    assert "- calculator(expression: str)" in first_prompt and "What is 12 * 7?" in first_prompt
    response = '<tool_response>{"name": "calculator", "content": "84"}</tool_response>'
    assert second_prompt.endswith(f"<|im_start|>user\n{response}<|im_end|>\n<|im_start|>assistant\n")
    assert [m["role"] for m in exp.messages] == ["user", "assistant", "user", "assistant"]
    body = exp.messages[2]["content"][len("<tool_response>") : -len("</tool_response>")]
    assert json.loads(body) == {"name": "calculator", "content": "84"}
    # Reward: the reward fn on the final answer; only the model's two replies are trained.
    assert exp.reward == 1.0 and exp.reward_components["exact_match"] == 1.0
    assert exp.metadata["episode"] == {
        "return": 1.0, "success": 1.0, "turns": 2, "invalid_actions": 0, "finish": "done"
    }
    spans = runs_of_ones(exp.action_mask)
    assert [tokenizer.decode(exp.response_ids[s:e], skip_special_tokens=True) for s, e in spans] == replies


def test_bad_tool_calls_are_invalid_actions(tokenizer):
    replies = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
        "<tool_call>nope</tool_call>",
        "0",
    ]
    engine = ScriptedEngine(tokenizer, lambda n, row, text: replies[n])
    (exp,) = tool_flow(engine, tokenizer, invalid_action="penalize", invalid_penalty=0.5).run_batch(
        [Task(id=1, prompt="What is 1 - 1?", answer="0")], SamplingParams(max_new_tokens=64), 0
    )
    assert exp.messages[2]["content"] == (
        '<tool_response>{"name": "calculator", "error": "calculator: division by zero"}</tool_response>'
    )
    assert exp.metadata["episode"]["invalid_actions"] == 2 and exp.reward == 1.0 - 2 * 0.5
    (ended,) = tool_flow(ScriptedEngine(tokenizer, lambda n, row, text: replies[n]), tokenizer).run_batch(
        [Task(id=1, prompt="What is 1 - 1?", answer="0")], SamplingParams(max_new_tokens=64), 0
    )
    assert ended.metadata["episode"]["finish"] == "invalid_action" and ended.reward == 0.0


def test_tool_settings_are_checked():
    assert workflow_args_problems("tool_calling", {"tools": ["calculator"], "max_turns": 3}) == []
    assert dict(workflow_args_problems("tool_calling", {"tools": ["calculator", "browser"]})) == {
        "tools": "unknown tool(s) ['browser']; available: calculator"
    }
    assert dict(workflow_args_problems("tool_calling", {"tools": "calculator"})) == {
        "tools": "expected a list, got a string"
    }
    assert dict(workflow_args_problems("tool_calling", {"env": "taxi"}))["env"].startswith("unknown key")
