"""Workflows turn tasks into scored experiences, using a rollout engine and a reward fn.

A workflow owns the conversation: how a task becomes messages and prompt tokens (chat template,
system prompt), how many turns there are, and which tokens are the model's own (action mask).
Single-turn workflows batch every task of a step into one engine call (`run_batch`); a multi-turn
workflow plays one episode (agent <-> environment turns) per rollout, every episode of a step together.

One task's fault (bad metadata, an environment, tool or reward fn that raises on it) is that task's
alone: `run_batch` drops its group and reports it as a TaskFailed in `failed`, and the step goes on
with the other tasks (the explorer counts them and fails the run only when every task of a step
failed). Engine errors are no task's fault and end the step.
"""
import logging
from collections.abc import Mapping
from contextlib import contextmanager
from typing import NamedTuple

from ..config_issues import Section, validate
from ..engines import RolloutEngine, SamplingParams
from ..experience import EXPERT_GROUP, Experience, Task
from ..json_values import json_value_problem
from ..registry import Registry
from ..stopping import StopRequested
from ..stopping import check as check_stop
from ..tokens import encode_end, encode_start

log = logging.getLogger(__name__)

WORKFLOWS = Registry("workflow")
# Each setting is a JSON value at most this long and deep (an environment's map, a list of tools):
# the workers build environments from it every episode, and the run page shows it.
MAX_ARG_CHARS = 64 * 1024
MAX_ARG_DEPTH = 16
# An overlong prompt's length is counted, for its warning, up to this many times max_prompt_tokens
# (a 1 MiB cell is 231,503 tokens and 2.1 s to count, once a task: the warning says "over" instead).
COUNTED_PROMPT_FACTOR = 16


class TaskFailed(Exception):
    """A task that could not be rolled out or scored; its message names the task and the cause."""

    def __init__(self, task_id, error: BaseException):
        self.task_id = task_id
        super().__init__(f"task {task_id}: {type(error).__name__}: {error}")
        self.__cause__ = error


class Prompt(NamedTuple):
    text: str  # the whole prompt as rendered
    ids: list[int]  # what the model reads: at most max_prompt_tokens tokens
    truncated: bool  # the text did not fit in max_prompt_tokens


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
        max_response_tokens: int | None = None,
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
        self.max_response_tokens = max_response_tokens  # explorer.max_new_tokens: what the model may write
        self._warned_truncated = set()  # the tasks whose cut prompt the run's log has been told of

    def run_batch(self, tasks: list[Task], params: SamplingParams, explorer_step: int,
                  failed: dict | None = None) -> list[Experience]:
        """`params.n` scored experiences per task, tasks in order. A task that fails (TaskFailed)
        has none: with `failed` (a dict) it is recorded there by task id and the others go on;
        without, the first failure is raised once the batch is done."""
        failures, experiences = {}, []
        for task in tasks:
            with self.isolated(task, failures):
                experiences += self.run(task, params, explorer_step)
        return self.settle(experiences, failures, failed)

    @contextmanager
    def isolated(self, task: Task, failures: dict):
        """Runs the block for one task; whatever it raises (but a Stop) fails that task alone: its
        first TaskFailed goes to failures[task.id] and the block is left."""
        try:
            yield
        except StopRequested:
            raise
        except Exception as err:  # noqa: BLE001 - an environment, tool or reward fn may raise anything
            failures.setdefault(task.id, err if isinstance(err, TaskFailed) else TaskFailed(task.id, err))

    @staticmethod
    def settle(experiences: list[Experience], failures: dict, failed: dict | None) -> list[Experience]:
        """The experiences of the tasks that did not fail; the failures go to `failed`, or the
        first is raised where the caller gave none."""
        if not failures:
            return experiences
        if failed is None:
            raise next(iter(failures.values()))
        failed.update(failures)
        return [exp for exp in experiences if exp.task_id not in failures]

    def run(self, task: Task, params: SamplingParams, explorer_step: int) -> list[Experience]:
        raise NotImplementedError

    # -- the pieces every workflow shares ---------------------------------------------------------

    def messages(self, task: Task) -> list[dict]:
        """The task's prompt as chat messages, with the configured system prompt first."""
        messages = [{"role": "user", "content": task.prompt}] if isinstance(task.prompt, str) else list(task.prompt)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def encode_prompt(self, messages: list[dict]) -> Prompt:
        """Prompt text and token ids, ending where the assistant's reply begins. Without a chat
        template the contents are joined by blank lines. An overlong prompt is cut to
        max_prompt_tokens tokens (`cut`), and only what is kept is tokenized (tokens.py). Every
        prompt of a step and of a task pipeline's pass over the taskset comes here: a Stop is
        checked here too."""
        check_stop()
        if self.use_chat_template:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(m["content"] for m in messages)
        ids = encode_end(self.tokenizer, text, self.max_prompt_tokens + 1)  # one past: tells a cut one
        if len(ids) <= self.max_prompt_tokens:
            return Prompt(text, ids, False)
        return Prompt(text, self.cut(messages) or ids[1:], True)

    def cut(self, messages: list[dict]) -> list[int] | None:
        """An overlong chat prompt's ids with the template's head kept: everything before the last
        message's text (system turn, earlier turns, the last turn's header: `<|im_start|>user`),
        then the end of that text, then the template's end (the assistant header). Its start is
        what goes: the model still reads a well-formed conversation, where keeping the last
        max_prompt_tokens tokens had cut the header and the rules' first words (tiny's Taxi
        opening is 270 tokens, the default max_prompt_tokens 256). None where there is no such
        head (no chat template) or it leaves the text no room: the prompt then keeps its end."""
        last = messages[-1]
        if not self.use_chat_template or not isinstance(last.get("content"), str):
            return None
        marker = "\x00PROMPT\x00"
        rendered = self.tokenizer.apply_chat_template(
            [*messages[:-1], {**last, "content": marker}], add_generation_prompt=True, tokenize=False
        )
        if rendered.count(marker) != 1:
            return None
        head, tail = rendered.split(marker)
        head_ids = encode_start(self.tokenizer, head, self.max_prompt_tokens)
        tail_ids = encode_start(self.tokenizer, tail, self.max_prompt_tokens)
        room = self.max_prompt_tokens - len(head_ids) - len(tail_ids)
        if room <= 0:
            return None
        return head_ids + encode_end(self.tokenizer, last["content"], room) + tail_ids

    def encode_task_prompt(self, task: Task, messages: list[dict]) -> Prompt:
        """encode_prompt for a task to roll out; the first time a task's prompt is cut, the run's
        log says so, with its length."""
        prompt = self.encode_prompt(messages)
        if prompt.truncated and task.id not in self._warned_truncated:
            self._warned_truncated.add(task.id)
            bound = COUNTED_PROMPT_FACTOR * self.max_prompt_tokens
            tokens = len(encode_start(self.tokenizer, prompt.text, bound + 1))
            log.warning("task %s: its prompt is %s tokens, over model.max_prompt_tokens (%d): the model reads it "
                        "with the start of its text cut off", task.id,
                        f"{tokens:,}" if tokens <= bound else f"over {bound:,}", self.max_prompt_tokens)
        return prompt

    def encode_response(self, text: str) -> list[int]:
        """A written (expert or human) response as the model would have produced it: ending with
        eos, or cut at max_response_tokens without one, as a rollout that long is (only what is kept
        is tokenized). An imported 3,000,000-character response trained whole: a row far past the
        model's context and any micro-batch's tokens."""
        eos, limit = self.tokenizer.eos_token_id, self.max_response_tokens
        if limit is None:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        ids = encode_start(self.tokenizer, text, limit)
        return [*ids, eos] if len(ids) < limit else ids

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
        response = task.metadata.get("expert_response", task.answer)
        if not isinstance(response, str):
            problem = f"metadata.expert_response must be text, got {type(response).__name__}"
            raise TaskFailed(task.id, ValueError(problem))
        experience = self._written(messages, self.encode_task_prompt(task, messages), response)
        experience.task_id, experience.group_id = task.id, f"{EXPERT_GROUP}{task.id}"
        experience.reward, experience.reward_components = self.score(response, task)
        return experience

    def written_experience(self, prompt: str | list[dict], response: str) -> Experience:
        """An imported expert response to `prompt` (text, or chat messages without the reply),
        formatted as a rollout of that prompt would be: the configured system prompt first where
        it has none, the model's chat template. A prompt cut to max_prompt_tokens says so in
        metadata.prompt_truncated, a response cut to max_response_tokens in response_truncated
        (the importer counts them, rather than a log line a row)."""
        messages = self.messages(Task(None, prompt))
        prompt = self.encode_prompt(messages)
        experience = self._written(messages, prompt, response)
        if prompt.truncated:
            experience.metadata["prompt_truncated"] = True
        return experience

    def _written(self, messages: list[dict], prompt: Prompt, response: str) -> Experience:
        response_ids = self.encode_response(response)
        cut = response_ids[-1:] != [self.tokenizer.eos_token_id]
        if cut:  # the text is what is trained, as a rollout cut at its length holds
            response = self.tokenizer.decode(response_ids)
        experience = Experience(
            task_id=None,
            group_id="",
            rollout_index=0,
            prompt_ids=prompt.ids,
            response_ids=response_ids,
            action_mask=[1] * len(response_ids),
            source="expert",
            prompt_text=prompt.text,
            response_text=response,
            messages=messages + [{"role": "assistant", "content": response}],
        )
        if cut:
            experience.metadata["response_truncated"] = True
        return experience
