"""Countdown: reach metadata['target'] with an arithmetic expression over metadata['numbers']."""
import ast
import json
import operator
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

from workers.rft.rewards.answer import tagged_answer
from workers.rft.rewards.base import reward_fn, task_field, warn_task

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_EXPRESSION_CHARS = 200  # a real answer is short; this also bounds ast's recursion
INTEGER = re.compile(r"\s*[-+]?\d+\s*")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value and the integer literals used, for + - * / and parentheses only (no eval).

    Raises ValueError (or SyntaxError, ZeroDivisionError) for anything else.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    used = []

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"not allowed: {ast.dump(node)}")

    return walk(ast.parse(expression.strip(), mode="eval").body), used


def response_expression(response: str) -> str:
    """The tagged answer, else the last non-empty line; a trailing '= 24' is dropped."""
    text = tagged_answer(response)
    if text is None:
        lines = [line for line in response.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return text.split("=")[0]


def _integer(value) -> int:
    """An int, a whole float (a Parquet column with a gap is float) or an integer's digits (a CSV cell)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and INTEGER.fullmatch(value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{str(value)[:40]!r} is not an integer")


def _numbers(value) -> list[int]:
    if isinstance(value, str):  # a CSV cell: '[5, 7, 2]'
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{value[:40]!r} is not a JSON list") from None
    if not isinstance(value, list):
        raise ValueError(f"{str(value)[:40]!r} is not a list")
    return [_integer(item) for item in value]


def puzzle(task) -> tuple[list[int], int] | None:
    """The task's metadata 'numbers' and 'target' as integers, also as an import from CSV leaves
    them ('[5, 7, 2]' or ['5', '7', '2'], '24'); None, with a warning naming the task and the key,
    where one is missing or not integers (the missing key raised KeyError, and ended the run)."""
    metadata = task_field(task, "metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    read = {}
    for key, convert in (("numbers", _numbers), ("target", _integer)):
        if key not in metadata:
            warn_task("countdown", task, f"has no metadata '{key}'")
            return None
        try:
            read[key] = convert(metadata[key])
        except ValueError as err:
            warn_task("countdown", task, f"metadata '{key}': {err}")
            return None
    return read["numbers"], read["target"]


@reward_fn("countdown")
def countdown(response: str, task, use_all: bool = False) -> float:
    """1.0 when the expression equals the target using only the given numbers, each at most once
    (exactly once with use_all=True)."""
    given = puzzle(task)
    if given is None:
        return 0.0
    numbers, target = given
    try:
        value, used = evaluate(response_expression(response))
    except (ValueError, SyntaxError, ZeroDivisionError):
        return 0.0
    available, used = Counter(numbers), Counter(used)
    fits = used == available if use_all else not used - available
    return float(fits and value == target)
