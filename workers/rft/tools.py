"""Python tools a tool-calling workflow lets the model use, by name.

A tool is a function of keyword arguments returning text (or anything `str()` renders); its
docstring's first line is what the model is told it does. Adding one is a function and a
decorator:

    @TOOLS.register("lookup")
    def lookup(key: str) -> str:
        "The value stored under key."
        ...

A tool signals a bad call (bad arguments, an expression it cannot evaluate) by raising
ToolError (or ValueError/TypeError); the model then sees the error as the tool's result.
"""
import ast
import inspect
import math
import operator

from .registry import Registry

TOOLS = Registry("tool")


class ToolError(Exception):
    """A call the tool refuses; the message goes back to the model."""


def describe(name: str) -> str:
    """One line for the prompt: name(arg: type, ...): what it does."""
    fn = TOOLS.get(name)
    params = ", ".join(
        f"{p.name}: {p.annotation.__name__ if isinstance(p.annotation, type) else 'any'}"
        for p in inspect.signature(fn).parameters.values()
    )
    return f"{name}({params}): {(inspect.getdoc(fn) or '').splitlines()[0]}"


def call(name: str, arguments: dict) -> str:
    """Run a registered tool; raises ToolError for an unknown tool or a call it refuses."""
    if name not in TOOLS:
        raise ToolError(f"unknown tool {name!r}; available: {', '.join(TOOLS.names())}")
    fn = TOOLS.get(name)
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as err:
        raise ToolError(f"{name}: {err}") from None
    try:
        return str(fn(**arguments))
    except (ToolError, ValueError, TypeError, ArithmeticError) as err:
        raise ToolError(f"{name}: {err}") from None


ARITHMETIC = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100  # 10**100 is fine; 10**10**10 would hang
# Every integer along the way, not just the exponent: (((9**99)**99)**99)**99 raises each result to
# a small power and ran past 60 s. 4096 bits (1,233 digits) is far beyond any arithmetic a task asks.
MAX_INT_BITS = 4096


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression must be text of at most {MAX_EXPRESSION_CHARS} characters")

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow):
                if abs(right) > MAX_EXPONENT:
                    raise ToolError(f"exponent {right} is too large")
                if isinstance(left, int) and isinstance(right, int) and abs(left).bit_length() * right > MAX_INT_BITS:
                    raise ToolError(f"the result would have more than {MAX_INT_BITS} bits")  # said before computing it
            value = ARITHMETIC[type(node.op)](left, right)
            if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
                raise ToolError(f"an intermediate result has more than {MAX_INT_BITS} bits")
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        raise ToolError(f"not arithmetic: {ast.unparse(node)}")

    try:
        value = walk(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r}") from None
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    return str(value)
