"""Whole numbers (ids, steps, limits) from what people send: a URL's query, a form, a JSON body.

`str.isdigit()` alone takes "²" (and other digits int() refuses: a 500), and an id past the
database's 64-bit integer still reaches the database: SQLite raises OverflowError for it in an
`__in` lookup (Django guards only `exact` and the range lookups). `whole_number` reads both as
not a number, so a view answers them as it answers any other wrong value.
"""
from collections.abc import Iterable

MAX_ID = 2**63 - 1  # a bigint's largest; SQLite's INTEGER too
SHOWN_CHARS = 40  # a refused value is quoted back this far: it may be a whole paste


def whole_number(value) -> int | None:
    """`value` (a string of ASCII digits, surrounding spaces allowed, or a JSON int) as an int
    from 0 to MAX_ID; None for anything else (bools, floats, signs, other digits, too large)."""
    if isinstance(value, str):
        value = value.strip()
        if not (value.isascii() and value.isdigit()) or len(value) > len(str(MAX_ID)):
            return None
        value = int(value)
    elif not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 0 <= value <= MAX_ID else None


def whole_numbers(values: Iterable) -> list[int]:
    """The whole numbers among `values` (?runs=1&runs=2, or "1,2" split), in order; others dropped."""
    return [number for number in map(whole_number, values) if number is not None]


def ids_sent(values: Iterable, name: str) -> tuple[list[int], list[str]]:
    """(the ids among `values`, in order; a problem for each other value, naming it as `name` sent
    it: "runs=abc", or "abc" for name ""). Blank values are nothing sent. Dropping the others silently answered
    ?runs=99999999999999999999 with "no run was given"."""
    ids, problems = [], []
    for value in values:
        if isinstance(value, str) and not value.strip():
            continue
        number = whole_number(value)
        if number is not None:
            ids.append(number)
            continue
        text = str(value).strip()
        shown = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
        sent = f"{name}=" if name else ""
        if text.isascii() and text.isdigit():
            problems.append(f"{sent}{shown} is too large for an id: ids go up to {MAX_ID}")
        else:
            problems.append(f"{sent}{shown!r} is not an id: an id is a whole number")
    return ids, problems
