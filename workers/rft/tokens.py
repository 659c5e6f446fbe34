"""A text's first or last n tokens without tokenizing all of it, and a model's context length.

A taskset cell may be 1 MiB, and the explorer tokenizes a prompt once a task a step, a judge
once a response. One 1 MiB text cost the tiny model's tokenizer 2.1 s as English (231,503 tokens)
and 8.5 s as digits (1,048,576 tokens) on the 2-core box: 8 judged responses to it were over a
minute of tokenizing a step before any model ran. No token covers more characters than the
longest entry of the vocabulary (its bytes, for a byte-level one), so a text's last n tokens lie
in its last (n + 1) * that many characters (one more for the token the cut splits), and only
those are tokenized: 3,341 characters for 256 of tiny's tokens.
"""
import weakref

_LONGEST = weakref.WeakKeyDictionary()  # tokenizer -> its longest vocabulary entry, in characters
# A model config that names no context length (max_position_embeddings or the like): a common
# one for small models, rather than no bound at all.
FALLBACK_CONTEXT = 4096


def longest_token(tokenizer) -> int:
    """The most characters one token can cover."""
    if tokenizer not in _LONGEST:
        _LONGEST[tokenizer] = max(map(len, tokenizer.get_vocab()), default=1)
    return _LONGEST[tokenizer]


def _ids(tokenizer, text: str, as_text: bool) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=as_text)["input_ids"]


def encode_start(tokenizer, text: str, n: int, as_text: bool = False) -> list[int]:
    """The ids of the text's first n tokens. as_text: special-token text in it ('<|im_end|>')
    stays ordinary tokens, as a model that spelled it out wrote it."""
    return _ids(tokenizer, text[: (n + 1) * longest_token(tokenizer)], as_text)[:n] if n > 0 else []


def encode_end(tokenizer, text: str, n: int, as_text: bool = False) -> list[int]:
    """The ids of the text's last n tokens (as_text: as encode_start)."""
    return _ids(tokenizer, text[-(n + 1) * longest_token(tokenizer):], as_text)[-n:] if n > 0 else []


def context_tokens(config) -> int:
    """The positions a model (its transformers config) was built for."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return FALLBACK_CONTEXT
