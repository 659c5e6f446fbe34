"""Tool calling: the model may call registered Python tools (workers/rft/tools.py) before it answers.

The format (Hermes/Qwen style), which the first user turn explains to the model:

    <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>

A reply with one or more tool calls gets their results back as the next user turn, one line each:

    <tool_response>{"name": "calculator", "content": "84"}</tool_response>

A call that cannot run (not JSON, an unknown tool, bad arguments, a tool error, a <tool_call> that
no </tool_call> closes, a reply cut off by max_new_tokens inside a call) is answered with
{"name": ..., "error": ...} and counts as an invalid action (`invalid_action`: end or penalize). A
reply without a tool call is the final answer, scored by explorer.reward_fn against the task; the
episode is a success when the answer is right (`answer_right`).
"""
import json
import re

from ..engines import Completion
from ..environments import Step, TextEnvironment
from ..experience import Task
from ..tools import TOOLS, ToolError, call, describe
from .base import WORKFLOWS
from .multi_turn import MultiTurnArgs, MultiTurnWorkflow

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALL = re.compile(f"{OPEN}(.*?){CLOSE}", re.DOTALL)
# Reward components that judge a reply's form, not whether its answer is right.
NOT_THE_ANSWER = ("format",)


def parse_tool_calls(reply: str, cut_off: bool = False) -> list[tuple[str, dict] | str]:
    """Each call in a reply as (name, arguments), or an error message where it is malformed. A
    <tool_call> left open is a malformed call, as is the start of one where the reply was cut off
    (`cut_off`: by max_new_tokens): it was never finished, so it is no answer either."""
    calls = []
    for body in TOOL_CALL.findall(reply):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(f"not JSON: {err}")
            continue
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(data.get("arguments", {}), dict)
        ):
            calls.append('expected {"name": <tool>, "arguments": {...}}')
            continue
        calls.append((data["name"], data.get("arguments", {})))
    rest = reply[reply.rfind(CLOSE) + len(CLOSE):] if CLOSE in reply else reply
    if OPEN in rest:
        calls.append(f"{OPEN} without {CLOSE}" + (" (the reply was cut off at max_new_tokens)" if cut_off else ""))
    elif cut_off and any(rest.endswith(OPEN[:n]) for n in range(len("<tool"), len(OPEN))):
        calls.append(f"the reply was cut off at max_new_tokens in {OPEN}")
    return calls


def answer_right(components: dict[str, float]) -> bool:
    """Whether the reward fn found the answer right: every component that judges it (all but
    NOT_THE_ANSWER and the `<fn>_failed` counts) at full marks, 1 (exact_match, numeric and
    countdown give 1 for a right answer, llm_judge at max_score). A wrong answer in the right
    format is no success."""
    judged = [value for name, value in components.items()
              if name not in NOT_THE_ANSWER and not name.endswith("_failed")]
    return bool(judged) and all(value >= 1.0 for value in judged)


class ToolEnvironment(TextEnvironment):
    """Runs the tools a reply calls; a reply without calls ends the episode with the reward fn's score."""

    def __init__(self, tools: list[str], reward_fn, task: Task):
        self.tools, self.reward_fn, self.task = tools, reward_fn, task
        self.instructions = (
            "You can call these tools:\n"
            + "\n".join(f"- {describe(name)}" for name in tools)
            + '\nTo call one, reply with <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call> and '
            "wait for its <tool_response>. When you know the answer, reply with the answer only."
        )

    def reset(self, seed, task) -> str:
        return ""

    def step(self, reply: str, cut_off: bool = False) -> Step:
        """`cut_off`: max_new_tokens ended the reply (see parse_tool_calls)."""
        calls = parse_tool_calls(reply, cut_off)
        if not calls:
            reward, components = self.reward_fn(reply, self.task)
            return Step("", reward, done=True, success=answer_right(components), components=components)
        lines, invalid = [], False
        for parsed in calls:
            if isinstance(parsed, str):
                lines.append({"name": None, "error": parsed})
                invalid = True
                continue
            name, arguments = parsed
            if name not in self.tools:
                lines.append({"name": name, "error": f"unknown tool; available: {', '.join(self.tools)}"})
                invalid = True
                continue
            try:
                lines.append({"name": name, "content": call(name, arguments)})
            except ToolError as err:
                lines.append({"name": name, "error": str(err)})
                invalid = True
        observation = "\n".join(f"<tool_response>{json.dumps(line)}</tool_response>" for line in lines)
        return Step(observation, invalid=invalid)


@WORKFLOWS.register("tool_calling")
class ToolCallingWorkflow(MultiTurnWorkflow):
    """Multi-turn with tools; the reward is explorer.reward_fn on the final answer, less
    invalid-call penalties."""

    class Args(MultiTurnArgs):
        tools: list = ["calculator"]
        """the tools the model may call (workers/rft/tools)"""

    @classmethod
    def check_args(cls, settings: dict) -> list[tuple[str, str]]:
        unknown = [name for name in settings["tools"] if name not in TOOLS]
        if not settings["tools"]:
            return [("tools", "name at least one tool")]
        if unknown:
            return [("tools", f"unknown tool(s) {unknown}; available: {', '.join(TOOLS.names())}")]
        return []

    def new_environment(self, task: Task) -> TextEnvironment:
        return ToolEnvironment(self.args["tools"], self.reward_fn, task)

    def react(self, env: ToolEnvironment, completion: Completion) -> Step:
        return env.step(completion.text, cut_off=completion.finish_reason == "length")
