"""Multi-turn workflows: the agent (the policy model) and an environment take turns until the
environment says done or a limit is reached.

Every episode of a step advances together: each turn is one engine call over all live episodes.
The tokens are the ones the model sampled, never re-tokenised, so logprobs and losses line up.
Between two replies the environment's text is tokenised exactly as the chat template renders it
(the end of the assistant turn, the observation as a user turn, the next assistant header).

`experience` (explorer.workflow_args) chooses what the trainer sees:
- `trajectory`: one experience per episode. Its response is every token after the first prompt;
  `action_mask` is 1 on the model's own tokens and 0 on environment text, so losses train only
  the model's replies. Reward: the episode's return.
- `step`: one experience per model turn (prompt = everything before that reply). Each carries the
  episode's return; advantages are computed once per episode (rollouts of a task compared) and
  broadcast to its steps (`algorithms.advantages.stepwise`). `rollout_index` is
  rollout * max_turns + turn, so every step keeps a natural key of its own;
  `metadata.rollout` and `metadata.turn` say which episode and turn it is.

An invalid action (a reply the environment cannot parse) costs `invalid_penalty` and, with
`invalid_action: end`, ends the episode; with `penalize` the environment shows what went wrong and
the episode goes on. Episode facts go to `metadata.episode` (the explorer averages them into
`episode/...` metrics).

Whatever an episode's environment (or tool, or reward fn) raises fails its task: the task's other
episodes stop, its group is dropped, and the step goes on (Workflow.run_batch).
"""
import functools
import inspect
import reprlib
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from pydantic import Field, PydanticSchemaGenerationError, TypeAdapter, ValidationError

from ..config_issues import Text
from ..engines import Completion, SamplingParams
from ..environments import ENVIRONMENTS, Step, TextEnvironment
from ..experience import Experience, Task
from ..stopping import StopRequested
from .base import WORKFLOWS, TaskFailed, Workflow

EXPERIENCE_KINDS = ("trajectory", "step")


class MultiTurnArgs(Workflow.Args):
    max_turns: int = Field(10, ge=1)
    """an episode ends after this many of the model's turns"""
    experience: Literal[EXPERIENCE_KINDS] = "trajectory"
    """trajectory: an episode is one experience · step: one experience per turn"""
    invalid_action: Literal["end", "penalize"] = "end"
    """what an invalid action does: end the episode, or cost invalid_penalty and go on"""
    invalid_penalty: float = Field(0.0, ge=0)
    """taken off the return for each invalid action"""
    max_tokens: int = Field(1024, ge=16)
    """prompt + every turn; an episode whose next turn would not fit ends (finish 'max_tokens')"""


@dataclass
class Episode:
    task: Task
    rollout: int
    env: TextEnvironment
    messages: list[dict]
    prompt_text: str
    prompt_ids: list[int]
    prompt_truncated: bool
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each reply in tokens
    finish_reasons: list[str] = field(default_factory=list)  # each reply's: stop | length
    env_return: float = 0.0
    invalid_actions: int = 0
    success: bool = False
    finish: str | None = None  # why it ended: done | max_turns | invalid_action | max_tokens
    components: dict = field(default_factory=dict)  # reward components a final step reported

    @property
    def done(self) -> bool:
        return self.finish is not None


class MultiTurnWorkflow(Workflow):
    """The episode loop. Subclasses say which environment an episode plays (`new_environment`)."""

    Args = MultiTurnArgs

    @classmethod
    def context_tokens(cls, prompt_tokens: int, new_tokens: int, settings: dict) -> int:
        """An episode grows to max_tokens (its first turn, never checked, to prompt + answer)."""
        return max(prompt_tokens + new_tokens, settings["max_tokens"])

    def __init__(self, engine, reward_fn, **options):
        super().__init__(engine, reward_fn, **options)
        self.stepwise = self.args["experience"] == "step"  # the explorer then broadcasts advantages
        self._turn_end = self._assistant_turn_end()

    def new_environment(self, task: Task) -> TextEnvironment:
        raise NotImplementedError

    # -- playing ---------------------------------------------------------------------------------

    def run_batch(self, tasks: list[Task], params: SamplingParams, explorer_step: int,
                  failed: dict | None = None) -> list[Experience]:
        failures, episodes = {}, []
        try:
            for task in tasks:
                with self.isolated(task, failures):
                    for rollout in range(params.n):
                        episodes.append(self.start(task, rollout))
            for turn in range(self.args["max_turns"]):
                live = [episode for episode in episodes if not episode.done and episode.task.id not in failures]
                if not live:
                    break
                seed = None if params.seed is None else params.seed * 1_009 + turn
                generations = self.engine.generate(
                    [episode.prompt_ids + episode.tokens for episode in live], replace(params, n=1, seed=seed)
                )
                for episode, (completion,) in zip(live, generations):
                    with self.isolated(episode.task, failures):
                        self.advance(episode, completion, params.max_new_tokens)
        finally:
            for episode in episodes:
                with self.isolated(episode.task, failures):
                    episode.env.close()
        experiences = [exp for episode in episodes if episode.task.id not in failures
                       for exp in self.experiences(episode, explorer_step)]
        return self.settle(experiences, failures, failed)

    def run(self, task: Task, params: SamplingParams, explorer_step: int) -> list[Experience]:
        return self.run_batch([task], params, explorer_step)

    def start(self, task: Task, rollout: int) -> Episode:
        """A fresh environment, reset with the task's seed (episode_seed) so every rollout of a
        task starts from the same state; the first user turn is the environment's instructions,
        the task's prompt and the first observation."""
        seed = episode_seed(task)
        env = self.new_environment(task)
        try:
            observation = env.reset(seed, task)
            chat = isinstance(task.prompt, list)
            opening = "\n\n".join(part for part in (env.instructions, "" if chat else task.prompt, observation) if part)
            prompt = (list(task.prompt) + [{"role": "user", "content": opening}]) if chat else opening
            messages = self.messages(replace(task, prompt=prompt))
            prompt_text, prompt_ids, truncated = self.encode_task_prompt(task, messages)
        except BaseException:
            env.close()
            raise
        return Episode(task, rollout, env, messages, prompt_text, prompt_ids, truncated)

    def advance(self, episode: Episode, completion: Completion, max_new_tokens: int) -> None:
        """Take one reply: record its tokens, let the environment answer, and either end the
        episode or append the environment's turn (masked out)."""
        start = len(episode.tokens)
        episode.tokens += completion.token_ids
        episode.mask += [1] * len(completion.token_ids)
        if episode.logprobs is not None and completion.logprobs is not None:
            episode.logprobs += completion.logprobs
        else:
            episode.logprobs = None  # some turn has none: the trainer recomputes them
        episode.spans.append((start, len(episode.tokens)))
        episode.finish_reasons.append(completion.finish_reason)
        episode.messages.append({"role": "assistant", "content": completion.text})

        step = self.react(episode.env, completion)
        episode.env_return += step.reward
        episode.success |= step.success
        episode.components.update(step.components)
        if step.invalid:
            episode.invalid_actions += 1
            if self.args["invalid_action"] == "end":
                episode.finish = "invalid_action"
        if step.done:
            episode.finish = "done"
        if not episode.done and len(episode.spans) >= self.args["max_turns"]:
            episode.finish = "max_turns"
        if episode.done:
            return
        observation = {"role": "user", "content": step.observation}
        env_ids = self.environment_tokens(episode.messages, observation, completion.finish_reason == "stop")
        if len(episode.prompt_ids) + len(episode.tokens) + len(env_ids) + max_new_tokens > self.args["max_tokens"]:
            episode.finish = "max_tokens"
            return
        episode.messages.append(observation)
        episode.tokens += env_ids
        episode.mask += [0] * len(env_ids)
        if episode.logprobs is not None:
            episode.logprobs += [0.0] * len(env_ids)

    def react(self, env: TextEnvironment, completion: Completion) -> Step:
        """The environment's answer to a reply."""
        return env.step(completion.text)

    # -- the environment's tokens ----------------------------------------------------------------

    def _assistant_turn_end(self) -> str:
        """What the chat template writes after the stop token that ends an assistant turn
        (ChatML: a newline)."""
        if not self.use_chat_template:
            return ""
        marker = "\x00REPLY\x00"
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}], tokenize=False
        )
        ending = marker + self.tokenizer.eos_token
        return rendered.split(ending, 1)[1] if ending in rendered else ""

    def environment_tokens(self, messages: list[dict], observation: dict, stopped: bool) -> list[int]:
        """Tokens from the end of the model's reply to the start of its next one: the close of
        the assistant turn (with the stop token the model did not write, if it was cut off), the
        observation's turn and the next assistant header, exactly as the chat template renders them.
        Without a chat template, the observation after a blank line, the reply right after it, as
        the first turn's prompt ends."""
        closing = ("" if stopped else self.tokenizer.eos_token) + self._turn_end
        if self.use_chat_template:
            before = self.tokenizer.apply_chat_template(messages, tokenize=False)
            after = self.tokenizer.apply_chat_template(
                messages + [observation], add_generation_prompt=True, tokenize=False
            )
            if not after.startswith(before):
                raise ValueError(
                    "the chat template does not render a conversation turn by turn; "
                    "multi-turn workflows need one that does"
                )
            text = closing + after[len(before) :]
        else:
            text = closing + "\n\n" + observation["content"]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # -- experiences -----------------------------------------------------------------------------

    def reward(self, episode: Episode) -> tuple[float, dict[str, float]]:
        penalty = self.args["invalid_penalty"] * episode.invalid_actions
        components = {"env_return": episode.env_return, "invalid_penalty": -penalty, **episode.components}
        return episode.env_return - penalty, components

    def summary(self, episode: Episode) -> dict:
        return {
            "return": episode.env_return,
            "success": float(episode.success),
            "turns": len(episode.spans),
            "invalid_actions": episode.invalid_actions,
            "finish": episode.finish,
        }

    def experiences(self, episode: Episode, explorer_step: int, source: str = "rollout") -> list[Experience]:
        reward, components = self.reward(episode)
        task = episode.task
        common = dict(
            task_id=task.id,
            group_id=f"{explorer_step}-{task.id}" if source == "rollout" else f"{source}-{task.id}",
            source=source,
            reward=reward,
            reward_components=components,
            model_version=self.engine.model_version if self.engine is not None else 0,
            explorer_step=explorer_step,
        )
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        if not self.stepwise or source != "rollout":
            return [
                Experience(
                    rollout_index=episode.rollout,
                    prompt_ids=episode.prompt_ids,
                    response_ids=episode.tokens,
                    action_mask=episode.mask,
                    prompt_text=episode.prompt_text,
                    response_text=decode(episode.tokens),
                    messages=episode.messages,
                    logprobs=episode.logprobs,
                    metadata={
                        "finish_reason": episode.finish_reasons[-1],
                        "prompt_truncated": episode.prompt_truncated,
                        "turn_spans": [list(span) for span in episode.spans],
                        "episode": self.summary(episode),
                    },
                    **common,
                )
            ]
        steps = []
        assistant_turns = [i for i, m in enumerate(episode.messages) if m["role"] == "assistant"]
        for turn, ((start, end), message_index) in enumerate(zip(episode.spans, assistant_turns)):
            last = turn == len(episode.spans) - 1
            steps.append(
                Experience(
                    rollout_index=episode.rollout * self.args["max_turns"] + turn,
                    prompt_ids=episode.prompt_ids + episode.tokens[:start],
                    response_ids=episode.tokens[start:end],
                    action_mask=[1] * (end - start),
                    prompt_text=episode.prompt_text + decode(episode.tokens[:start]),
                    response_text=episode.messages[message_index]["content"],
                    messages=episode.messages[: message_index + 1],
                    logprobs=episode.logprobs[start:end] if episode.logprobs is not None else None,
                    metadata={
                        "finish_reason": episode.finish_reasons[turn],
                        "prompt_truncated": episode.prompt_truncated,
                        "rollout": episode.rollout,
                        "turn": turn,
                        **({"episode": self.summary(episode)} if last else {}),
                    },
                    **common,
                )
            )
        return steps

    def expert_experience(self, task: Task) -> Experience:
        """A scripted expert's episode as one trajectory experience (SFT warm-up data): the replies
        in task.metadata['expert_replies'] (a list of texts), else the environment's own expert.
        Anything wrong is a TaskFailed naming the task."""
        try:
            episode = self.start(task, rollout=0)
            try:
                replies = task.metadata.get("expert_replies") or episode.env.expert_replies()
                if not replies:
                    raise ValueError("no expert replies (metadata.expert_replies) and the environment has no expert")
                if not isinstance(replies, list) or not all(isinstance(reply, str) for reply in replies):
                    # A text would be played one character a turn ("down": "d", an invalid action).
                    raise ValueError(f"metadata.expert_replies must be a list of replies (texts), "
                                     f"got {reprlib.repr(replies)}")
                cut = False
                for reply in replies:
                    if episode.done:
                        break
                    completion = self._expert_reply(reply)
                    self.advance(episode, completion, max_new_tokens=len(completion.token_ids))
                    cut |= completion.finish_reason == "length"
            finally:
                episode.env.close()
        except StopRequested:
            raise
        except TaskFailed:
            raise
        except Exception as err:  # noqa: BLE001 - the environment's, in its words, with the task named
            raise TaskFailed(task.id, err) from err
        experience = self.experiences(episode, explorer_step=0, source="expert")[0]
        if cut:  # as a written response cut in _written says (the importer and the log count them)
            experience.metadata["response_truncated"] = True
        return experience

    def _expert_reply(self, reply: str) -> Completion:
        """A scripted reply as the model would have written it (encode_response): ending with its
        stop token, or cut at explorer.max_new_tokens without one, and then as a rollout cut at its
        length is: the kept tokens' text, which the environment acts on and the conversation shows
        (the full reply's text made the environment answer what is not trained), and finish reason
        "length", so the turn is closed with the stop token the model did not write
        (environment_tokens)."""
        ids = self.encode_response(reply)
        if ids[-1:] == [self.tokenizer.eos_token_id]:
            return Completion(ids, reply, None, "stop")
        return Completion(ids, self.tokenizer.decode(ids), None, "length")


def episode_seed(task: Task) -> int | None:
    """The seed an episode of the task starts from: metadata.seed, an integer >= 0 or its digits
    as text (a CSV's cells are text); without one, the task's id."""
    seed = task.metadata.get("seed")
    if seed is None:
        return task.id
    if isinstance(seed, str) and seed.strip().isdecimal():
        return int(seed)
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    raise ValueError(f"metadata.seed must be an integer >= 0 (or its digits as text), got {reprlib.repr(seed)}")


def _fits(value, hint) -> bool:
    """Whether a JSON value fits an environment's annotation, as pydantic reads it strictly (an int
    is a fine float, a bool is no number). Annotations pydantic cannot check are not checked here
    (the value is still a bounded JSON value: Bounded)."""
    if hint is inspect.Parameter.empty:
        return True
    try:
        _adapter(hint).validate_python(value, strict=True)
    except ValidationError:
        return False
    except PydanticSchemaGenerationError:
        return True
    return True


@functools.cache
def _adapter(hint) -> TypeAdapter:
    return TypeAdapter(hint)


def _type_text(hint) -> str:
    return hint.__name__ if isinstance(hint, type) and not get_args(hint) else str(hint)


@WORKFLOWS.register("multi_turn")
class EnvironmentWorkflow(MultiTurnWorkflow):
    """Episodes of a registered text environment (explorer.workflow_args.env). Reward: the
    environment's return, less invalid-action penalties; explorer.reward_fn is not used."""

    class Args(MultiTurnArgs):
        env: Text
        """the registered environment (workers/rft/environments)"""
        env_args: dict = {}
        """the environment's own settings, checked against its signature"""

    @classmethod
    def check_args(cls, settings: dict) -> list[tuple[str, str]]:
        if settings["env"] not in ENVIRONMENTS:
            return [("env", f"unknown environment {settings['env']!r}; known: {', '.join(ENVIRONMENTS.names())}")]
        signature = inspect.signature(ENVIRONMENTS.get(settings["env"]), eval_str=True)
        try:
            bound = signature.bind(**settings["env_args"])
        except TypeError as err:
            return [("env_args", f"environment {settings['env']}: {err}")]
        problems = []
        for name, value in bound.arguments.items():
            parameter = signature.parameters[name]
            if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue  # its annotation is of each item, not of the collected dict or tuple
            if not _fits(value, parameter.annotation):
                problems.append((
                    f"env_args.{name}",
                    f"environment {settings['env']} takes {_type_text(parameter.annotation)}, "
                    f"got {reprlib.repr(value)}",
                ))
        return problems or cls._start_problems(settings)

    @staticmethod
    def _start_problems(settings: dict) -> list[tuple[str, str]]:
        """Values of the right types the environment still refuses (FrozenLake's map_name '9x9',
        a desc of ragged rows): it is built once here, so the run does not fail at its first step."""
        try:
            ENVIRONMENTS.get(settings["env"])(**settings["env_args"]).close()
        except Exception as err:  # noqa: BLE001 - whatever the environment raises, in its words
            return [("env_args", f"environment {settings['env']} does not start with these settings: "
                                 f"{type(err).__name__}: {reprlib.repr(str(err))}")]
        return []

    def new_environment(self, task: Task) -> TextEnvironment:
        return ENVIRONMENTS.get(self.args["env"])(**self.args["env_args"])
