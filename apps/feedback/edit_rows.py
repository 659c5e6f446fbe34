"""An edit's row: the corrected response as a human_edit experience (expert data for SFT and MIX),
tokenized with the run's own tokenizer, loaded once per process and ahead of the first edit."""
import functools
import threading

from apps.buffer.models import Experience
from workers.rft.config import ExplorerConfig

Status = Experience.Status


def store_human_edit(parent: Experience, user, text: str) -> Experience:
    response_ids = _encode_response(parent.run, text)
    fields = {
        "response_text": text,
        "response_ids": response_ids or [],
        "action_mask": [1] * len(response_ids or []),
        "logprobs": None,  # no generation logprobs: a person wrote it (None is "none", for every writer)
        # Without the run's tokenizer the row cannot be trained on yet: it waits, raw, to be tokenized.
        "status": Status.READY if response_ids is not None else Status.RAW,
        "metadata": {"edited_by": user.username, **({} if response_ids is not None else {"needs_tokenizing": True})},
    }
    unused = unused_edit(parent, user)
    if unused is not None:
        for name, value in fields.items():
            setattr(unused, name, value)
        unused.save(update_fields=list(fields))
        return unused
    return Experience.objects.create(
        run=parent.run, task=parent.task, explorer_step=parent.explorer_step, group_id=parent.group_id,
        rollout_index=parent.rollout_index, source=Experience.Source.HUMAN_EDIT, parent=parent,
        prompt_text=parent.prompt_text, messages=parent.messages, prompt_ids=parent.prompt_ids,
        model_version=parent.model_version, **fields,
    )


def unused_edit(parent: Experience, user) -> Experience | None:
    """The user's edit of `parent` as a human_edit row, while no trainer step has used it."""
    return parent.children.filter(
        source=Experience.Source.HUMAN_EDIT, metadata__edited_by=user.username, use_count=0, claimed_at__isnull=True
    ).exclude(status=Status.CONSUMED).first()


def _encode_response(run, text: str) -> list[int] | None:
    """The edit's token ids as the run's model would have produced them (ending with eos), or
    None for a run without a model (imported data)."""
    path = _model_path(run)
    if not path:
        return None
    tokenizer = _tokenizer(path)
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def too_long(run, text: str) -> str | None:
    """Why the edit is longer than the run's model may answer (explorer.max_new_tokens, its
    end-of-text token included), or None. An edit of 5,000 emoji (20,018 tokens, under the
    character limit) trained 159 s a step on the tiny model, 40 times past its context, and held
    Stop for as long. Edits are at most MAX_EDIT_CHARS characters: tokenized whole, in milliseconds."""
    ids, limit = _encode_response(run, text), answer_tokens(run)
    if ids is None or len(ids) <= limit:
        return None
    tokens = len(ids)
    return (f"the edited response is {tokens:,} tokens with its end; this run's model answers in at most {limit:,} "
            "(explorer.max_new_tokens), and a longer edit would teach it an answer it cannot finish: shorten it")


def answer_tokens(run) -> int:
    """The most tokens the run's model writes in an answer (explorer.max_new_tokens): an edit's bound."""
    return ExplorerConfig.model_validate(((run.config or {}).get("explorer") or {}) if run else {}).max_new_tokens


def _model_path(run) -> str | None:
    return ((run.config or {}).get("model") or {}).get("path") if run else None


# One load at a time: transformers' lazy imports are not thread-safe (an edit racing the background
# load of prepare_edits failed with "cannot import name 'AutoTokenizer'"); a second caller waits
# for the first's tokenizer instead.
_tokenizer_lock = threading.Lock()


def _tokenizer(path: str):
    with _tokenizer_lock:
        return _loaded_tokenizer(path)


@functools.lru_cache(maxsize=4)
def _loaded_tokenizer(path: str):
    from workers.rft.models import load_tokenizer  # transformers: imported only when an edit needs it

    return load_tokenizer(path)


_tokenizers_asked: set[str] = set()


def prepare_edits(run) -> None:
    """Load the run's tokenizer on a background thread when an item of the run is shown, once per
    process: importing transformers takes seconds, which the annotator's first edit would wait."""
    path = _model_path(run)
    if path and path not in _tokenizers_asked:
        _tokenizers_asked.add(path)
        threading.Thread(target=_tokenizer, args=(path,), name=f"tokenizer {path}", daemon=True).start()
