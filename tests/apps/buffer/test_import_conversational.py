"""Hugging Face TRL's dataset formats (standard and conversational; prompt-completion; preference
with an explicit or an implicit prompt) imported as expert data: each stored as the layout the
product already has, a chat prompt as `messages` whose reply a run's chat template formats when it
copies the dataset (expert_data.py). Malformed turns are refused with their line, nothing kept."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.buffer import expert_import
from apps.buffer.expert_data import _prompt_and_response
from apps.buffer.models import Experience
from apps.core.files import FileImportError
from apps.feedback.models import Feedback

SYSTEM = {"role": "system", "content": "Be brief."}
ASK = {"role": "user", "content": "What color is the sky?"}
BLUE = {"role": "assistant", "content": "It is blue."}
GREEN = {"role": "assistant", "content": "It is green."}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def stored() -> list[tuple]:
    return [(e.prompt_text, e.response_text, e.messages) for e in Experience.objects.order_by("pk")]


def test_sft_conversational_and_prompt_completion_rows(tmp_path, db):
    again = {"role": "user", "content": "And at night?"}
    path = write_jsonl(tmp_path / "sft.jsonl", [
        # The last assistant turn is the response; the turns before it, earlier replies too, the prompt.
        {"messages": [SYSTEM, ASK, BLUE, again, {"role": "assistant", "content": "Black."}]},
        {"prompt": "The sky is", "completion": " blue."},
        {"prompt": [ASK], "completion": [BLUE]},
        {"prompt": "The sky is", "completion": [{"role": "assistant", "content": " blue."}]},
    ])
    assert expert_import.import_expert_data(path).rows == 4
    assert stored() == [
        ("Be brief.\n\nWhat color is the sky?\n\nIt is blue.\n\nAnd at night?", "Black.",
         [SYSTEM, ASK, BLUE, again, {"role": "assistant", "content": "Black."}]),
        ("The sky is", " blue.", None),
        ("What color is the sky?", "It is blue.", [ASK, BLUE]),
        ("The sky is", " blue.", None),
    ]
    # A run's copy asks its chat template for the prompt turns and learns the last reply.
    first = Experience.objects.order_by("pk").first()
    assert _prompt_and_response(first) == ([SYSTEM, ASK, BLUE, again], "Black.")


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_dpo_conversational_pairs_with_explicit_and_implicit_prompts(tmp_path, curator, suffix):
    rows = [
        {"prompt": [SYSTEM, ASK], "chosen": [BLUE], "rejected": [GREEN]},  # explicit prompt
        {"chosen": [SYSTEM, ASK, BLUE], "rejected": [SYSTEM, ASK, GREEN]},  # implicit: the turns both begin with
    ]
    path = tmp_path / f"pairs.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, [*rows, {"prompt": "What color is the sky?", "chosen": [BLUE], "rejected": [GREEN]}])
    else:  # list<struct<role, content>> columns, as Hugging Face datasets write them; a null prompt is implicit
        pq.write_table(pa.table({"prompt": [rows[0]["prompt"], None], "chosen": [r["chosen"] for r in rows],
                                 "rejected": [r["rejected"] for r in rows]}), path)

    assert expert_import.import_expert_data(path, layout="dpo", user=curator).rows == len(rows) + (suffix == "jsonl")

    chat = ("Be brief.\n\nWhat color is the sky?", "It is blue.", [SYSTEM, ASK, BLUE])
    chat_rejected = (chat[0], "It is green.", [SYSTEM, ASK, GREEN])
    text = [("What color is the sky?", "It is blue.", None), ("What color is the sky?", "It is green.", None)]
    # The implicit prompt is stored as the explicit one is: a run formats both alike.
    assert stored() == [chat, chat_rejected, chat, chat_rejected, *(text if suffix == "jsonl" else [])]
    statuses = list(Experience.objects.order_by("pk").values_list("status", flat=True))
    assert statuses[:4] == ["ready", "rejected", "ready", "rejected"]
    assert Feedback.objects.filter(kind="preference", value=1.0).count() == len(rows) + (suffix == "jsonl")


BAD_SFT = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "'messages' has no assistant turn"),
    ({"messages": [ASK, BLUE, {"role": "user", "content": "and?"}]}, "goes on after its last assistant turn (turn 2)"),
    ({"messages": [BLUE]}, "'messages' has no prompt"),
    ({"messages": [{"content": "hi"}, BLUE]}, "'messages': message 1 has no string 'role'"),
    ({"messages": [{"role": "user"}, BLUE]}, "'messages': message 1 has no string 'content'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, BLUE]},
     "'messages': message 1 has no string 'content': it is an array"),
    ({"messages": [{"role": "human", "content": "hi"}, BLUE]},
     "message 1 has the unknown role 'human' (known: system, user, assistant, tool)"),
    ({"prompt": [ASK], "completion": [ASK]}, "'completion' must be one assistant turn (the prompt goes in 'prompt'), "
                                             "got a user turn"),
    ({"prompt": [ASK], "completion": [BLUE, BLUE]}, "'completion' must be one assistant turn"),
    ({"prompt": [ASK], "completion": []}, "'completion' is an empty list of chat turns"),
    ({"prompt": [ASK], "completion": 4}, "'completion' must be text or a list of one assistant turn, got a number"),
    ({"completion": "x"}, "a row with a 'completion' needs a 'prompt'"),
    ({"prompt": "p", "response": "r", "completion": "r"}, "give 'response' or 'completion', not both"),
    ({"prompt": [ASK], "completion": [{"role": "assistant", "content": " "}]}, "'completion' is empty"),
]
BAD_DPO = [
    ({"chosen": [ASK, BLUE], "rejected": [{"role": "user", "content": "Other?"}, GREEN]},
     "'chosen' and 'rejected' do not begin with the same turns"),
    ({"chosen": [SYSTEM, ASK, BLUE], "rejected": [SYSTEM, {"role": "user", "content": "Other?"}, GREEN]},
     "do not share the implicit prompt: after the 1 turn they begin with, 'chosen' has 2 turns"),
    ({"chosen": [ASK, BLUE], "rejected": [ASK]}, "'rejected' has 0 turns where its one assistant reply should be"),
    ({"chosen": [ASK, BLUE], "rejected": [ASK, BLUE]}, "'chosen' and 'rejected' are the same response"),
    ({"chosen": [ASK, BLUE], "rejected": "It is green."}, "must both be text or both be chat turns"),
    ({"chosen": "It is blue.", "rejected": "It is green."}, "missing 'prompt'"),
    ({"prompt": [ASK], "chosen": [ASK, BLUE], "rejected": [GREEN]}, "'chosen' must be one assistant turn"),
    ({"chosen": [ASK, {"role": "assistant"}], "rejected": [ASK, GREEN]}, "'chosen': message 2 has no string 'content'"),
    ({"chosen": [{"role": "bot", "content": "x"}], "rejected": [ASK, GREEN]}, "unknown role 'bot'"),
    ({"chosen": [ASK, {"role": "assistant", "content": ""}], "rejected": [ASK, GREEN]}, "'chosen' is empty"),
]


@pytest.mark.parametrize("layout, bad_row, message",
                         [("sft", row, message) for row, message in BAD_SFT]
                         + [("dpo", row, message) for row, message in BAD_DPO])
def test_a_malformed_conversation_is_named_and_nothing_is_kept(tmp_path, curator, layout, bad_row, message):
    good = {"sft": {"messages": [ASK, BLUE]}, "dpo": {"chosen": [ASK, BLUE], "rejected": [ASK, GREEN]}}[layout]
    path = write_jsonl(tmp_path / "data.jsonl", [good, good, good, bad_row])
    with pytest.raises(FileImportError) as error:
        expert_import.import_expert_data(path, layout=layout, user=curator, batch_size=2)  # two rows already inserted
    assert (error.value.file, error.value.line) == ("data.jsonl", 4)
    assert message in error.value.message, error.value.message
    assert not Experience.objects.exists() and not Feedback.objects.exists()
