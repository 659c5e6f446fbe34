"""Built-in generated tasksets, deterministic by seed: `generate('arithmetic', 100, seed=0)`.

Each task is {'prompt', 'answer', 'metadata', 'difficulty'}. Tasks are drawn one after another
from one seeded stream, so the first n tasks of a larger taskset are the taskset of size n.
"""
import math
import random
import re

from workers.rft.registry import Registry
from workers.rft.rewards.base import task_field

BUILTIN_TASKSETS = Registry("built-in taskset")

OP_DIFFICULTY = {"+": 0.0, "-": 0.5, "*": 1.0}  # added to log10 of the larger operand


def generate(name: str, n: int, seed: int = 0, **params) -> list[dict]:
    rng = random.Random(seed)
    make = BUILTIN_TASKSETS.get(name)
    return [make(rng, **params) for _ in range(n)]


def arithmetic_task(a: int, op: str, b: int) -> dict:
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {
        "prompt": f"What is {a} {op} {b}?",
        "answer": str(answer),
        "metadata": {"a": a, "op": op, "b": b},
        "difficulty": round(OP_DIFFICULTY[op] + math.log10(1 + max(a, b)), 3),
    }


@BUILTIN_TASKSETS.register("arithmetic")
def arithmetic(rng: random.Random, max_operand: int = 10, ops: str = "+-*") -> dict:
    """a op b with 0 <= a, b <= max_operand; for '-' the larger operand comes first (no negatives)."""
    if max_operand < 1 or not ops or set(ops) - set(OP_DIFFICULTY):
        raise ValueError(f"arithmetic needs max_operand >= 1 and ops drawn from '+-*', got {max_operand}, {ops!r}")
    op = rng.choice(list(ops))
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    if op == "-":
        a, b = max(a, b), min(a, b)
    return arithmetic_task(a, op, b)


PROBLEM = re.compile(r"(\d+)\s*([-+*])\s*(\d+)")


def harder_variant(task, seed: int = 0) -> dict:
    """A harder arithmetic task from a solved one (a mapping or an experience.Task): same operator,
    each operand x becomes 10x + d with d in 1..9, drawn deterministically from seed and the task."""
    meta = task_field(task, "metadata") or {}
    if {"a", "op", "b"} <= meta.keys():
        a, op, b = meta["a"], meta["op"], meta["b"]
    else:  # an arithmetic task stored without our metadata: read the prompt
        prompt = task_field(task, "prompt")
        found = PROBLEM.search(prompt) if isinstance(prompt, str) else None
        if not found:
            raise ValueError(f"not an arithmetic task: {prompt!r}")
        a, op, b = int(found[1]), found[2], int(found[3])
    rng = random.Random(f"{seed}:{a}{op}{b}")  # a string seed hashes the same in every process
    a, b = 10 * a + rng.randint(1, 9), 10 * b + rng.randint(1, 9)
    if op == "-":
        a, b = max(a, b), min(a, b)
    return arithmetic_task(a, op, b)


@BUILTIN_TASKSETS.register("countdown")
def countdown(rng: random.Random, count: int = 3, max_number: int = 20) -> dict:
    """`count` numbers in 1..max_number and a target reachable using each exactly once.

    The target is built by combining random pairs with + - * / while every intermediate value stays
    a positive integer; the answer is that expression (one of possibly several valid ones).
    """
    if count < 2 or max_number < 1:
        raise ValueError(f"countdown needs count >= 2 and max_number >= 1, got {count}, {max_number}")
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        (x, left), (y, right) = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
        options = [(x + y, "+"), (x * y, "*")]
        options += [(x - y, "-")] if x > y else []
        options += [(x // y, "/")] if x % y == 0 else []
        value, op = rng.choice(options)
        pool.append((value, f"({left} {op} {right})"))
    target, expression = pool[0]
    return {
        "prompt": f"Using the numbers {numbers}, write an expression that equals {target}. "
        "Use + - * / and parentheses, each number at most once. "
        "Put the expression inside <answer></answer>.",
        "answer": expression[1:-1],
        "metadata": {"numbers": numbers, "target": target},
        "difficulty": round(count + math.log10(target), 3),
    }


@BUILTIN_TASKSETS.register("episodes")
def episodes(rng: random.Random, prompt: str = "") -> dict:
    """One task per episode to play, each with its own environment seed (metadata.seed); the
    environment itself is named by the workflow (explorer.workflow_args.env)."""
    return {"prompt": prompt, "answer": "", "metadata": {"seed": rng.randrange(2**31)}, "difficulty": 0.0}
