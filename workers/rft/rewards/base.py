"""The reward fn registry and `build_reward`, which turns the config's reward_fn into one callable.

A reward fn is fn(response: str, task, **params) -> float, where task is a mapping or an object
(e.g. experience.Task) with 'answer' and 'metadata'. A model-based fn also has a `batch` attribute,
batch(responses, tasks, limits, **params) -> [float | None], which scores a whole step in one call;
None means it could not score that response (counted in the component '<name>_failed'). `limits`
(ReadLimits) is how much of each text the run lets a model read: a model's cost grows with the
square of what it reads, and a taskset cell may be 1 MiB.

Its params are what a config may set, so each is declared (`reward_fn`): typed and defaulted by
the signature, bounded by rules, and checked at launch with the rest of the config.
"""
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from workers.rft.registry import Registry

log = logging.getLogger(__name__)
REWARD_FNS = Registry("reward fn")
# The architectures (class-name suffixes, as transformers names them) of a generative model: what
# a policy or a judge directory must hold (the server checks its config.json).
CAUSAL_LM = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def reward_fn(name: str, **rules: dict):
    """Registers fn(response, task, **params) as reward fn `name`. Each param after (response,
    task) needs an annotation (bool, int, float or str), is required where it has no default, and
    follows rules[param] as config_issues.field_of reads them (ge, gt, le, lt, choices, check,
    model), e.g. max_new_tokens={"ge": 1, "le": 1024}. Counts need an upper bound and text a
    check, choices or `model`: a param is a request to a shared worker (test_rewards.py checks)."""

    def add(fn):
        fn.rules = rules
        return REWARD_FNS.register(name)(fn)

    return add


@dataclass(frozen=True)
class ReadLimits:
    """The most tokens of each text a reward model reads (None: only its own context bounds it):
    of the task's prompt, its end, as the policy reads it (a run's model.max_prompt_tokens); of a
    response or a reference answer, its start, as long as a response may be (explorer.max_new_tokens).
    A judge or reward model cuts them further to fit its context (rewards.models.fit_texts)."""

    prompt_tokens: int | None = None
    response_tokens: int | None = None


def task_field(task, name: str, default=None):
    """task[name] for a mapping, task.name for an object such as experience.Task."""
    if isinstance(task, Mapping):
        return task.get(name, default)
    return getattr(task, name, default)


def task_label(task) -> str:
    """How a warning names a task: its id, else the start of its prompt."""
    task_id = task_field(task, "id")
    if task_id is not None:
        return f"task {task_id}"
    prompt = task_field(task, "prompt", "")
    return f"the task with prompt {str(prompt)[:60]!r}"


@lru_cache(maxsize=4096)
def _warn(fn: str, task: str, problem: str) -> None:
    log.warning("reward fn %s: %s %s; its responses score 0", fn, task, problem)


def warn_task(fn: str, task, problem: str) -> None:
    """Logs that reward fn `fn` cannot score `task` (problem: what is wrong, naming the field),
    once per task and problem in this process (the cache remembers 4,096): every rollout of every
    step scores the task again, and a warning each time would bury the log."""
    _warn(fn, task_label(task), problem)


def build_reward(spec, limits: ReadLimits | None = None):
    """spec: a name, or a mapping {name: weight} where a weight may also be {weight: w, <params>}.
    limits: what a model-based fn reads of each text (a run's; default: its model's context).

    Returns reward(response, task) -> (total, components): components holds each fn's own score,
    total the weighted sum. Unknown names raise KeyError; bad params or weights raise TypeError or
    ValueError here, not at the first rollout.
    """
    limits = limits or ReadLimits()
    if isinstance(spec, str):
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("reward_fn must be a name or a non-empty mapping {name: weight}")
    terms = []  # (name, fn, weight, params)
    for name, value in spec.items():
        fn = REWARD_FNS.get(name)
        params = dict(value) if isinstance(value, Mapping) else {"weight": value}
        weight = params.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"weight of reward fn '{name}' must be a number, got {weight!r}")
        try:
            inspect.signature(fn).bind("", {}, **params)
        except TypeError as err:
            raise TypeError(f"reward fn '{name}': {err}") from None
        terms.append((name, fn, float(weight), params))

    def batch(responses: list[str], tasks: list) -> list[tuple[float, dict[str, float]]]:
        """Each response's (total, components); batched fns get every response at once."""
        components = [{} for _ in responses]
        for name, fn, _, params in terms:
            if hasattr(fn, "batch"):
                scores = fn.batch(responses, tasks, limits, **params)
                for parts, score in zip(components, scores):
                    parts[name] = 0.0 if score is None else float(score)
                    parts[f"{name}_failed"] = float(score is None)
            else:
                for parts, response, task in zip(components, responses, tasks):
                    parts[name] = float(fn(response, task, **params))
        return [(sum(weight * parts[name] for name, _, weight, _ in terms), parts) for parts in components]

    def reward(response: str, task) -> tuple[float, dict[str, float]]:
        return batch([response], [task])[0]

    reward.batch = batch
    return reward
