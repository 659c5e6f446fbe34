"""Built-in generated tasksets."""
import re

import pytest

from workers.rft.datasets import BUILTIN_TASKSETS, arithmetic_task, generate, harder_variant
from workers.rft.rewards import REWARD_FNS

PROBLEM = re.compile(r"^What is (\d+) ([-+*]) (\d+)\?$")


def test_builtin_names():
    assert BUILTIN_TASKSETS.names() == ["arithmetic", "countdown", "episodes"]
    with pytest.raises(KeyError, match="unknown built-in taskset 'gsm9k'; known: arithmetic, countdown, episodes"):
        generate("gsm9k", 3)


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_deterministic_by_seed_and_prefix_stable(name):
    tasks = generate(name, 20, seed=1)
    assert tasks == generate(name, 20, seed=1)
    assert tasks[:5] == generate(name, 5, seed=1)  # growing a taskset keeps its first tasks
    assert tasks != generate(name, 20, seed=2)
    assert all(set(t) == {"prompt", "answer", "metadata", "difficulty"} for t in tasks)


def test_arithmetic_tasks_are_right():
    tasks = generate("arithmetic", 200, seed=0, max_operand=12)
    for t in tasks:
        a, op, b = PROBLEM.match(t["prompt"]).groups()
        a, b = int(a), int(b)
        assert t["answer"] == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert 0 <= b <= 12 and 0 <= a <= 12 and int(t["answer"]) >= 0
        assert REWARD_FNS.get("exact_match")(f"{t['prompt']} {t['answer']}", t) == 1.0
    assert {t["metadata"]["op"] for t in tasks} == {"+", "-", "*"}
    assert {t["metadata"]["op"] for t in generate("arithmetic", 50, ops="+")} == {"+"}


def test_arithmetic_prompt_answer_and_difficulty():
    # difficulty = op weight (+ 0, - .5, * 1) + log10(1 + larger operand): log10(8) = .903
    assert arithmetic_task(7, "+", 5) == {
        "prompt": "What is 7 + 5?", "answer": "12", "metadata": {"a": 7, "op": "+", "b": 5}, "difficulty": 0.903,
    }
    assert arithmetic_task(7, "*", 5)["difficulty"] == 1.903
    assert arithmetic_task(70, "+", 50)["difficulty"] == 1.851  # log10(71)
    assert arithmetic_task(7, "-", 5)["difficulty"] == 1.403


def test_arithmetic_rejects_bad_params():
    with pytest.raises(ValueError):
        generate("arithmetic", 1, ops="/")
    with pytest.raises(ValueError):
        generate("arithmetic", 1, max_operand=0)
    with pytest.raises(TypeError):
        generate("arithmetic", 1, max_operands=5)


def test_countdown_targets_are_reachable_with_every_number_once():
    score = REWARD_FNS.get("countdown")
    for t in generate("countdown", 100, seed=3, count=4, max_number=12):
        numbers, target = t["metadata"]["numbers"], t["metadata"]["target"]
        assert len(numbers) == 4 and all(1 <= n <= 12 for n in numbers)
        assert isinstance(target, int) and target > 0 and str(numbers) in t["prompt"] and str(target) in t["prompt"]
        assert score(f"<answer>{t['answer']}</answer>", t, use_all=True) == 1.0


def test_harder_variant():
    easy = arithmetic_task(7, "*", 5)
    hard = harder_variant(easy)
    a, b = hard["metadata"]["a"], hard["metadata"]["b"]
    assert hard["metadata"]["op"] == "*" and 71 <= a <= 79 and 51 <= b <= 59  # 10x + d, d in 1..9
    assert hard["answer"] == str(a * b) and hard["difficulty"] > easy["difficulty"]
    assert harder_variant(easy) == hard  # deterministic
    # a task stored without our metadata is read from its prompt; '-' keeps the larger operand first
    hard = harder_variant({"prompt": "What is 2 - 9?", "answer": "-7", "metadata": {}})
    assert hard["metadata"]["a"] >= hard["metadata"]["b"] and hard["metadata"]["op"] == "-"
    with pytest.raises(ValueError, match="not an arithmetic task"):
        harder_variant({"prompt": "Name a colour.", "answer": "red"})
