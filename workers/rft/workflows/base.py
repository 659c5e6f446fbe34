"""Workflows turn tasks into scored experiences, using a rollout engine and a reward fn.

A workflow owns the conversation: how a task becomes messages and prompt tokens (chat template,
system prompt), how many turns there are, and which tokens are the model's own (action mask).
Single-turn workflows batch every task of a step into one engine call (`run_batch`); a multi-turn
workflow overrides `run` to play one episode (agent <-> environment turns) per task.
"""
from collections.abc import Mapping

from ..config_issues import Section, validate
from ..engines import RolloutEngine, SamplingParams
from ..experience import EXPERT_GROUP, Experience, Task
from ..json_values import json_value_problem
from ..registry import Registry
from ..stopping import check as check_stop
from ..tokens import encode_end

WORKFLOWS = Registry("workflow")
# Each setting is a JSON value at most this long and deep (an environment's map, a list of tools):
# the workers build environments from it every episode, and the run page shows it.
MAX_ARG_CHARS = 64 * 1024
MAX_ARG_DEPTH = 16


def _bounded(value) -> str | None:
    too_big = json_value_problem(value, max_depth=MAX_ARG_DEPTH, max_chars=MAX_ARG_CHARS)
    if too_big:
        path, problem = too_big
        return f"{path} {problem}" if path else problem
    return None


class Workflow:
    # The settings this workflow reads from explorer.workflow_args, a config section of its own
    # (pydantic, as the config's): anything else is an error.
    class Args(Section):
        pass

    @classmethod
    def args_problems(cls, args) -> list[tuple[str, str]]:
        """(key, problem) for each bad setting: one past MAX_ARG_CHARS or MAX_ARG_DEPTH (before
        anything quotes it), else unknown keys, wrong types, missing required ones, then the
        workflow's own checks (`check_args`) once every value passed."""
        too_big = [(str(key), problem) for key, value in args.items() if (problem := _bounded(value))] \
            if isinstance(args, Mapping) else []
        issues = []
        settings, _ = validate(cls.Args, args, "", issues)
        return too_big or [(issue.key, issue.message) for issue in issues] or cls.check_args(settings.model_dump())

    @classmethod
    def check_args(cls, settings: dict) -> list[tuple[str, str]]:
        """Checks beyond types (a registered name, settings that fit together)."""
        return []

    @classmethod
    def settings(cls, args: dict) -> dict:
        return cls.Args.model_validate(args).model_dump()

    @classmethod
    def context_tokens(cls, prompt_tokens: int, new_tokens: int, settings: dict) -> int:
        """The most tokens a rollout's sequence holds: what the engine's context must take."""
        return prompt_tokens + new_tokens

    @classmethod
    def name(cls) -> str:
        return next((name for name in WORKFLOWS if WORKFLOWS.get(name) is cls), cls.__name__)

    def __init__(
        self,
        engine: RolloutEngine | None,
        reward_fn,
        *,
        tokenizer=None,
        system_prompt: str | None = None,
        use_chat_template: bool = True,
        max_prompt_tokens: int = 256,
        **workflow_args,
    ):
        problems = self.args_problems(workflow_args)
        if problems:
            raise ValueError("; ".join(f"explorer.workflow_args.{key}: {problem}" for key, problem in problems))
        self.args = self.settings(workflow_args)
        self.engine = engine  # None where only prompts are formatted (expert data for a trainer-only run)
        self.tokenizer = tokenizer or engine.tokenizer
        self.reward_fn = reward_fn  # reward(response, task) -> (total, components), see rewards.build_reward
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template
        self.max_prompt_tokens = max_prompt_tokens

    def run_batch(self, tasks: list[Task], params: SamplingParams, explorer_step: int) -> list[Experience]:
        """`params.n` scored experiences per task, tasks in order."""
        return [exp for task in tasks for exp in self.run(task, params, explorer_step)]

    def run(self, task: Task, params: SamplingParams, explorer_step: int) -> list[Experience]:
        raise NotImplementedError

    # -- the pieces every workflow shares ---------------------------------------------------------

    def messages(self, task: Task) -> list[dict]:
        """The task's prompt as chat messages, with the configured system prompt first."""
        messages = [{"role": "user", "content": task.prompt}] if isinstance(task.prompt, str) else list(task.prompt)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def encode_prompt(self, messages: list[dict]) -> tuple[str, list[int]]:
        """Prompt text and token ids, ending where the assistant's reply begins. Without a chat
        template the contents are joined by blank lines. An overlong prompt keeps its last
        max_prompt_tokens tokens, and only its end is tokenized (tokens.py). Every prompt of a step
        and of a task pipeline's pass over the taskset comes here: a Stop is checked here too."""
        check_stop()
        if self.use_chat_template:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(m["content"] for m in messages)
        return text, encode_end(self.tokenizer, text, self.max_prompt_tokens)

    def encode_response(self, text: str) -> list[int]:
        """A written (expert or human) response as the model would have produced it: ending with eos."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def score(self, response: str, task: Task) -> tuple[float, dict[str, float]]:
        return self.reward_fn(response, task)

    def score_batch(self, responses: list[str], tasks: list[Task]) -> list[tuple[float, dict[str, float]]]:
        """Every response of a step at once where the reward fn is batched (reward models)."""
        if hasattr(self.reward_fn, "batch"):
            return self.reward_fn.batch(responses, tasks)
        return [self.score(response, task) for response, task in zip(responses, tasks)]

    def expert_experience(self, task: Task) -> Experience:
        """The task's reference answer as an expert experience, formatted exactly like a rollout
        so SFT teaches what the explorer will be asked. `metadata['expert_response']`, when a
        taskset provides it, is the full written response (e.g. with tags or working); else the
        answer itself is the response."""
        messages = self.messages(task)
        prompt_text, prompt_ids = self.encode_prompt(messages)
        response = task.metadata.get("expert_response", task.answer)
        response_ids = self.encode_response(response)
        reward, components = self.score(response, task)
        return Experience(
            task_id=task.id,
            group_id=f"{EXPERT_GROUP}{task.id}",
            rollout_index=0,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            action_mask=[1] * len(response_ids),
            source="expert",
            prompt_text=prompt_text,
            response_text=response,
            messages=messages + [{"role": "assistant", "content": response}],
            reward=reward,
            reward_components=components,
        )
