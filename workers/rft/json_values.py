"""Bounded JSON values: what a config (or a part of it, like a workflow's settings) may hold.

A value from a user is checked before anything else walks it: mappings with string keys, lists,
strings, finite numbers, booleans and null (what Postgres JSON stores: no NUL character and no lone
surrogate in a string or key), nested at most `max_depth` containers deep and at most `max_chars`
characters long as JSON. The walk uses its own stack and
stops at the first excess, so a huge or deeply nested value costs no more than the limit to refuse.
"""
import math
import re

JSON_SCALARS = (str, int, float, bool, type(None))
# Postgres text and jsonb hold neither; a lone surrogate ("\ud800" in JSON) cannot even be encoded
# as UTF-8, so it fails wherever the string is written: the database, a page, a log line.
UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why Postgres (or any UTF-8 output) cannot take this string, else None."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    if found[0] == "\x00":
        return "must not contain a NUL character (\\x00)"
    return f"must not contain a lone surrogate ({ascii(found[0])[1:-1]}): that is not text"


def json_value_problem(value, *, max_depth: int, max_chars: int) -> tuple[str, str] | None:
    """(path, problem) for the first part of `value` that is not a bounded JSON value, else None.
    `path` is dotted from `value` ('' for value itself; 'desc[3]' for an item of a list)."""
    chars = 0
    stack = [("", value, 0)]  # (path, value, how many containers hold it)
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth + 1 > max_depth:
                return path, f"is nested more than {max_depth} levels deep"
            chars += 2 + max(len(item) - 1, 0)  # brackets and commas
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return path, f"has a key that is not a string: {key!r} (quote it)"
                    if problem := text_problem(key):  # named by ascii(): the key itself cannot be shown
                        return path, f"has a key {ascii(key)} that {problem}"
                    chars += len(key) + 3  # quotes and colon
                    stack.append((f"{path}.{key}" if path else key, child, depth + 1))
            else:
                stack.extend((f"{path}[{i}]", child, depth + 1) for i, child in enumerate(item))
        elif isinstance(item, JSON_SCALARS):
            if isinstance(item, float) and not math.isfinite(item):
                return path, "must be a finite number"
            if isinstance(item, str) and (problem := text_problem(item)):
                return path, problem
            chars += _json_length(item)
        else:
            return path, (
                f"must be a mapping, list, string, number, boolean or null, got {type(item).__name__} "
                "(quote it to make it a string)"
            )
        if chars > max_chars:
            return "", f"is more than {max_chars} characters long as JSON"
    return None


def _json_length(scalar) -> int:
    if isinstance(scalar, str):
        return len(scalar) + 2  # escapes aside
    if isinstance(scalar, int) and not isinstance(scalar, bool):
        return scalar.bit_length() * 3 // 10 + 2  # digits, without converting (Python refuses > 4300)
    return len(repr(scalar))  # a float; True, False and None are as long as true, false, null
