"""Text environments: what a multi-turn workflow's agent talks to.

An environment speaks text both ways. `reset` starts an episode and returns the first observation;
`step` takes the model's whole reply, parses the action out of it and returns a `Step`. A reply
that names no legal action is an *invalid action*: the environment reports it (`Step.invalid`)
and stays where it was; the workflow decides whether that ends the episode or costs a penalty
(`explorer.workflow_args.invalid_action`).

A user environment is one class and one decorator:

    @ENVIRONMENTS.register("guess_number")
    class GuessNumber(TextEnvironment):
        instructions = "Guess my number between 1 and 10. Reply with the number only."
        def reset(self, seed, task): ...   -> first observation (str)
        def step(self, reply): ...         -> Step(observation, reward, done, invalid, success)

and `explorer.workflow_args: {env: guess_number, env_args: {...}}` plays it. Keyword arguments of
the class are the environment's settings (`env_args`), checked when the config is validated.
"""
import re
from dataclasses import dataclass, field

from ..registry import Registry

ENVIRONMENTS = Registry("environment")


@dataclass
class Step:
    observation: str  # what the agent sees next ("" when done)
    reward: float = 0.0  # reward of this step; an episode's return is the sum
    done: bool = False
    invalid: bool = False  # the reply named no legal action; nothing happened
    success: bool = False  # the episode reached its goal (for the success-rate metric)
    components: dict = field(default_factory=dict)  # named reward parts, shown beside the reward


class TextEnvironment:
    """Base class of environments over text. Subclasses set `instructions` and implement reset/step."""

    instructions: str = ""  # the rules and the reply format, shown before the first observation

    def reset(self, seed: int | None, task) -> str:
        """Start an episode (deterministically for a given seed); return the first observation.
        `task` is the experience.Task being played: its metadata may carry per-task settings."""
        raise NotImplementedError

    def step(self, reply: str) -> Step:
        raise NotImplementedError

    def expert_replies(self) -> list[str] | None:
        """From a fresh reset: replies that solve the episode (scripted expert for SFT warm-up),
        or None where the environment has no expert."""
        return None

    def close(self) -> None:
        pass


ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def parse_action(reply: str, actions: list[str]) -> int | None:
    """The index of the action a reply names, else None.

    The action is the text of the last <action>...</action> in the reply, else the whole reply;
    case, surrounding spaces and a final full stop do not matter; an action's index (e.g. "2")
    names it too. "I go right" names nothing: the reply must be the action.
    """
    tagged = ACTION_TAG.findall(reply)
    text = (tagged[-1] if tagged else reply).strip().strip(".").strip().lower()
    if text in actions:
        return actions.index(text)
    if text.isdigit() and int(text) < len(actions):
        return int(text)
    return None
