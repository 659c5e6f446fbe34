"""Countdown: reach metadata['target'] with an arithmetic expression over metadata['numbers']."""
import ast
import operator
from collections import Counter
from fractions import Fraction

from workers.rft.rewards.answer import tagged_answer
from workers.rft.rewards.base import reward_fn, task_field

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_EXPRESSION_CHARS = 200  # a real answer is short; this also bounds ast's recursion


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


@reward_fn("countdown")
def countdown(response: str, task, use_all: bool = False) -> float:
    """1.0 when the expression equals the target using only the given numbers, each at most once
    (exactly once with use_all=True)."""
    metadata = task_field(task, "metadata") or {}
    try:
        value, used = evaluate(response_expression(response))
    except (ValueError, SyntaxError, ZeroDivisionError):
        return 0.0
    available, used = Counter(metadata["numbers"]), Counter(used)
    fits = used == available if use_all else not used - available
    return float(fits and value == metadata["target"])
