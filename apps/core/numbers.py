"""Whole numbers (ids, steps, limits) from what people send: a URL's query, a form, a JSON body.

`str.isdigit()` alone takes "²" (and other digits int() refuses: a 500), and an id past the
database's 64-bit integer still reaches the database: SQLite raises OverflowError for it in an
`__in` lookup (Django guards only `exact` and the range lookups). `whole_number` reads both as
not a number, so a view answers them as it answers any other wrong value.
"""
from collections.abc import Iterable

MAX_ID = 2**63 - 1  # a bigint's largest; SQLite's INTEGER too


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
