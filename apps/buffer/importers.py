"""Read expert data files (JSONL, Parquet) as a stream of experience fields; see docs/data-formats.md.

Two layouts, in the standard (text) and conversational (chat turns) formats of Hugging Face TRL.
SFT: one experience a row, `prompt` + `response` (or `completion`) or chat `messages`, optionally
with token ids, rewards and metadata (an rftweb experience export is such a file). DPO: one
preference pair a row, `prompt` + `chosen` + `rejected`, or chat `chosen` + `rejected` whose shared
leading turns are the prompt. A chat prompt is stored as the experience's `messages` (the reply
appended), from which a run applies its model's chat template when it copies the dataset
(expert_data.py), as it does for a taskset's chat prompts. The files are read by the shared readers
(apps.core.files), so they stream in constant memory and every problem is a `FileImportError`
naming the file, the line (or Parquet row) and the field. Nothing here touches the database.
"""

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.parquet as pq

from apps.core.files import (
    FileImportError,
    ReadProgress,
    detect_format,
    json_type,
    json_value,
    parse_json,
    read_jsonl,
    read_parquet,
    text,
)

FORMATS = ("jsonl", "parquet")  # what expert data is read from: CSV cannot hold chat messages or token arrays
LAYOUTS = ("sft", "dpo")
# An exported experience is one line: its token ids and logprobs make it far longer than a task.
MAX_LINE_BYTES = 64 * 1024 * 1024
INT32 = np.iinfo(np.int32)
# The roles of chat turns that chat templates know (Hugging Face's, OpenAI's): another is a typo
# the template would drop or refuse only when a run starts.
ROLES = ("system", "user", "assistant", "tool")

# The columns a Parquet reader asks for (the others are not read); JSONL rows simply ignore them.
SFT_COLUMNS = (
    "prompt",
    "response",
    "completion",
    "messages",
    "prompt_ids",
    "response_ids",
    "action_mask",
    "logprobs",
    "reward",
    "reward_components",
    "group_id",
    "rollout_index",
    "model_version",
    "priority",
    "metadata",
)
DPO_COLUMNS = ("prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "metadata")


@dataclass
class ExperienceFields:
    """The fields of one imported experience (its source is always `expert`)."""

    prompt_text: str
    response_text: str
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    action_mask: list[int] | None = None
    logprobs: list[float] | None = None
    reward: float | None = None
    reward_components: dict = field(default_factory=dict)
    group_id: str = ""
    rollout_index: int = 0
    model_version: int = 0
    priority: float = 0.0
    metadata: dict = field(default_factory=dict)


def detect_expert_format(filename: str) -> str:
    return detect_format(filename, FORMATS, "expert data")


def read_expert_data(
    path: Path, fmt: str, layout: str, *, display_name: str | None = None, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[tuple[ExperienceFields, ...], ReadProgress]]:
    """Yield (experiences, progress) for each row: one experience for an SFT row, (chosen,
    rejected) for a DPO row. Raises FileImportError."""
    path = Path(path)
    name = display_name or path.name
    if fmt not in FORMATS:
        raise FileImportError(name, None, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if layout not in LAYOUTS:
        raise FileImportError(name, None, f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    if not path.is_file():
        raise FileImportError(name, None, f"no such file: {path}")
    columns, parse = (SFT_COLUMNS, _sft_row) if layout == "sft" else (DPO_COLUMNS, _dpo_row)
    if fmt == "jsonl":
        records = read_jsonl(path, name, max_line_bytes)
    else:
        records = read_parquet(path, name, _parquet_columns(path, name, columns), max_line_bytes)
    rows = 0
    for location, unit, record, progress in records:
        try:
            experiences = parse(record)
        except ValueError as exc:
            raise FileImportError(name, location, str(exc), unit=unit) from None
        rows += 1
        yield experiences, progress
    if rows == 0:
        raise FileImportError(name, None, "the file has no rows")


def _parquet_columns(path: Path, name: str, wanted: tuple[str, ...]) -> list[str]:
    """The wanted columns the file has: the reader reads only those, and insists on all of them."""
    try:
        present = set(pq.read_schema(path).names)
    except (pyarrow.ArrowException, OSError) as exc:
        raise FileImportError(name, None, f"not a readable Parquet file ({exc})") from None
    return [column for column in wanted if column in present]


# ---- one record -> experience fields (ValueError names the field and the problem) ----


def _sft_row(record: dict) -> tuple[ExperienceFields]:
    messages = _chat(record["messages"], "messages") if _given(record, "messages") else None
    reply_key = _reply_key(record)
    if reply_key:
        if not _given(record, "prompt"):
            raise ValueError(f"a row with a {reply_key!r} needs a 'prompt'")
        prompt = _prompt(record["prompt"], "prompt")
        response = _taught(_reply(record[reply_key], reply_key), repr(reply_key))
        if messages is None and isinstance(prompt, list):
            messages = [*prompt, {"role": "assistant", "content": response}]
        prompt_text = _render(prompt)
    elif messages is not None:
        last = max((n for n, turn in enumerate(messages) if turn["role"] == "assistant"), default=None)
        if last is None:
            raise ValueError("'messages' has no assistant turn: the last one is the response to learn")
        if last < len(messages) - 1:
            raise ValueError(f"'messages' goes on after its last assistant turn (turn {last + 1}) with a "
                             f"{messages[-1]['role']} turn that nothing would learn from; end it with the reply")
        if last == 0:
            raise ValueError("'messages' has no prompt: its assistant reply is its first turn")
        response = _taught(messages[-1]["content"], "the assistant's reply in 'messages'")
        prompt_text = _prompt_text_from(record, messages[:-1])
    else:
        raise ValueError("needs 'prompt' and 'response' (or 'completion'), or chat 'messages' ending with the "
                         "assistant's reply")

    experience = ExperienceFields(prompt_text=prompt_text, response_text=response, messages=messages)
    experience.prompt_ids = _token_ids(record, "prompt_ids")
    experience.response_ids = _token_ids(record, "response_ids")
    experience.action_mask = _aligned(record, "action_mask", experience.response_ids, _mask)
    if experience.action_mask is None and experience.response_ids is not None:
        experience.action_mask = [1] * len(experience.response_ids)  # every token is the response's own
    experience.logprobs = _aligned(record, "logprobs", experience.response_ids, _floats)
    experience.reward = _number(record.get("reward"), "reward") if _given(record, "reward") else None
    experience.reward_components = _components(record.get("reward_components"))
    experience.group_id = _string(record["group_id"], "group_id", limit=100) if _given(record, "group_id") else ""
    experience.rollout_index = _count(record.get("rollout_index"), "rollout_index")
    experience.model_version = _count(record.get("model_version"), "model_version")
    experience.priority = _number(record["priority"], "priority") if _given(record, "priority") else 0.0
    experience.metadata = _object(record.get("metadata"), "metadata")
    return (experience,)


def _dpo_row(record: dict) -> tuple[ExperienceFields, ExperienceFields]:
    missing = [key for key in ("chosen", "rejected") if not _given(record, key)]
    if not missing and isinstance(record["chosen"], list) != isinstance(record["rejected"], list):
        raise ValueError("'chosen' and 'rejected' must both be text or both be chat turns")
    conversational = not missing and isinstance(record["chosen"], list)
    if not conversational and not _given(record, "prompt"):
        missing.insert(0, "prompt")  # only chat chosen and rejected carry an implicit prompt
    if missing:
        raise ValueError(
            f"missing {', '.join(repr(key) for key in missing)} (a DPO row has prompt, chosen and rejected, "
            "or chat chosen and rejected that begin with the same prompt turns)"
        )
    if _given(record, "prompt"):
        prompt = _prompt(record["prompt"], "prompt")
        chosen, rejected = (_reply(record[key], key) for key in ("chosen", "rejected"))
    else:
        prompt, chosen, rejected = _implicit_prompt(_chat(record["chosen"], "chosen"),
                                                    _chat(record["rejected"], "rejected"))
    prompt_ids = _token_ids(record, "prompt_ids")
    metadata = _object(record.get("metadata"), "metadata")
    chosen = _taught(chosen, "'chosen'")
    if chosen == rejected:
        # DPO's loss of a pair is -log sigmoid(beta * (margin of chosen - margin of rejected)): with
        # one response on both sides it is ln 2 whatever the model, and its gradient 0.
        raise ValueError("'chosen' and 'rejected' are the same response: the pair prefers nothing")
    pair = []
    for index, (side, response) in enumerate((("chosen", chosen), ("rejected", rejected))):
        messages = [*prompt, {"role": "assistant", "content": response}] if isinstance(prompt, list) else None
        pair.append(
            ExperienceFields(
                prompt_text=_render(prompt),
                response_text=response,
                messages=messages,
                prompt_ids=prompt_ids,
                response_ids=_token_ids(record, f"{side}_ids"),
                rollout_index=index,
                metadata={**metadata, "preference": side},
            )
        )
    return tuple(pair)


def _implicit_prompt(chosen: list[dict], rejected: list[dict]) -> tuple[list[dict], str, str]:
    """TRL's implicit prompt: the turns chat `chosen` and `rejected` begin with, each then going on
    with its one assistant reply. Returns (prompt turns, chosen reply, rejected reply)."""
    if chosen == rejected:
        raise ValueError("'chosen' and 'rejected' are the same response: the pair prefers nothing")
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise ValueError("'chosen' and 'rejected' do not begin with the same turns, which would be their prompt "
                         "(or give the 'prompt' apart)")
    for key, turns in (("chosen", chosen), ("rejected", rejected)):
        rest = turns[shared:]
        if len(rest) != 1 or rest[0]["role"] != "assistant":
            found = f"{len(rest)} turns" if len(rest) != 1 else f"a {rest[0]['role']} turn"
            begun = f"{shared} turn{'s' * (shared != 1)}"
            raise ValueError(
                f"'chosen' and 'rejected' do not share the implicit prompt: after the {begun} they begin with, "
                f"{key!r} has {found} where its one assistant reply should be"
            )
    return chosen[:shared], chosen[-1]["content"], rejected[-1]["content"]


def _reply_key(record: dict) -> str | None:
    """The SFT row's response: `response`, or TRL's `completion`."""
    given = [key for key in ("response", "completion") if _given(record, key)]
    if len(given) == 2:
        raise ValueError("give 'response' or 'completion', not both")
    return given[0] if given else None


def _reply(value, key: str) -> str:
    """A response: text, or TRL's conversational form, a list of one assistant turn."""
    if isinstance(value, str):
        return _string(value, key)
    if not isinstance(value, list):
        raise ValueError(f"{key!r} must be text or a list of one assistant turn, got {json_type(value)}")
    turns = _turns(value, key)
    if len(turns) != 1 or turns[0]["role"] != "assistant":
        found = f"{len(turns)} turns" if len(turns) != 1 else f"a {turns[0]['role']} turn"
        raise ValueError(f"{key!r} must be one assistant turn (the prompt goes in 'prompt'), got {found}")
    return turns[0]["content"]


def _taught(response: str, what: str) -> str:
    """A response a row teaches the model to write: an empty one (or only white space) would teach
    it to stop at once, as tasksets refuse an empty prompt."""
    if not response.strip():
        raise ValueError(f"{what} is empty: the row would teach the model to answer nothing; leave it out")
    return response


def _given(record: dict, key: str) -> bool:
    return record.get(key) is not None


def _prompt_text_from(record: dict, prompt_messages: list[dict]) -> str:
    return _string(record["prompt"], "prompt") if _given(record, "prompt") else _render(prompt_messages)


def _render(prompt: str | list[dict]) -> str:
    """A chat prompt as text the way the engine writes it without a chat template: contents joined by blank lines."""
    return prompt if isinstance(prompt, str) else "\n\n".join(message["content"] for message in prompt)


def _string(value, key: str, limit: int | None = None) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key!r} must be a string, got {json_type(value)}")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{key!r} is {len(value)} characters long, over the limit of {limit}")
    return text(value, repr(key))


def _prompt(value, key: str) -> str | list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{key!r} is empty")
        return text(value, repr(key))
    return _chat(value, key)


def _chat(value, key: str) -> list[dict]:
    """Chat messages: a list of {role, content} objects, or the same list as JSON text (Parquet)."""
    value = _decoded(value, key)
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"{key!r} must be text or a non-empty list of chat messages {{role, content}}, got {json_type(value)}"
        )
    return _turns(value, key)


def _turns(value: list, key: str) -> list[dict]:
    """Each turn a {role, content} object of a known role and text content (a chat template reads
    nothing else of a list of content parts)."""
    if not value:
        raise ValueError(f"{key!r} is an empty list of chat turns")
    for number, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise ValueError(f"{key!r}: message {number} is {json_type(message)}, not a {{role, content}} object")
        for part in ("role", "content"):
            if part not in message or message[part] is None:
                raise ValueError(f"{key!r}: message {number} has no string {part!r}")
            if not isinstance(message[part], str):
                raise ValueError(f"{key!r}: message {number} has no string {part!r}: it is "
                                 f"{json_type(message[part])}")
        if message["role"] not in ROLES:
            raise ValueError(f"{key!r}: message {number} has the unknown role {message['role']!r} "
                             f"(known: {', '.join(ROLES)})")
    return [json_value(message) for message in value]


def _object(value, key: str) -> dict:
    value = _decoded(value, key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key!r} must be an object, got {json_type(value)}")
    return json_value(value)


def _components(value) -> dict[str, float]:
    components = _object(value, "reward_components")
    return {name: _number(score, f"reward_components.{name}") for name, score in components.items()}


def _decoded(value, key: str):
    """Parquet has no type for arbitrary JSON, so exports store these fields as JSON text."""
    if not isinstance(value, str):
        return value
    try:
        return parse_json(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{key!r} is text but not valid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise ValueError(f"{key!r}: {exc}") from None


def _number(value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} must be a number, got {json_type(value)}")
    if not math.isfinite(value):  # JSON's 1e400 reads as infinity; it would turn advantages to NaN
        raise ValueError(f"{key!r} must be a finite number, got {value!r}")
    return float(value)


def _count(value, key: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key!r} must be a whole number of at least 0, got {value!r}")
    return value


def _token_ids(record: dict, key: str) -> list[int] | None:
    if not _given(record, key):
        return None
    values = _list(record[key], key)
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or not INT32.min <= value <= INT32.max:
            raise ValueError(f"{key!r}[{position}] is {value!r}, not a 32-bit integer token id")
    return values


def _mask(values: list, key: str) -> list[int]:
    for position, value in enumerate(values):
        if isinstance(value, bool) or value not in (0, 1):
            raise ValueError(f"{key!r}[{position}] is {value!r}; a mask holds 0 and 1")
    return values


def _floats(values: list, key: str) -> list[float]:
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{key!r}[{position}] is {value!r}, not a number")
    return [float(value) for value in values]


def _aligned(record: dict, key: str, response_ids: list[int] | None, check) -> list | None:
    """action_mask and logprobs have one entry per response token."""
    if not _given(record, key):
        return None
    values = check(_list(record[key], key), key)
    if response_ids is None:
        raise ValueError(f"{key!r} is given without 'response_ids'")
    if len(values) != len(response_ids):
        raise ValueError(f"{key!r} has {len(values)} entries for {len(response_ids)} response tokens")
    return values


def _list(value, key: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{key!r} must be a list, got {json_type(value)}")
    return value
