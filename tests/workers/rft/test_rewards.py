"""Rule-based rewards and build_reward."""
from types import SimpleNamespace

import pytest

from workers.rft.rewards import REWARD_FNS, build_reward
from workers.rft.rewards.answer import extract_answer

exact_match, numeric, countdown, format_reward = map(REWARD_FNS.get, ("exact_match", "numeric", "countdown", "format"))


def task(answer="", **metadata):
    return {"answer": answer, "metadata": metadata}


@pytest.mark.parametrize("response, expected", [
    ("I think <answer> 12 </answer> because 3", "12"),
    ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last tagged answer counts
    ("48/2 = 24 apples.\n#### 24", "24"),
    ("7 + 5 = 12, so 12.", "12"),
    ("it is -3", "-3"),
    ("total 1,234 units", "1,234"),
    ("  Paris  ", "Paris"),
])
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize("response, answer, reward", [
    ("7 + 5 = 12", "12", 1.0),
    ("<answer>12.0</answer>", "12", 1.0),  # numerically equal
    ("<answer>1,234</answer>", "1234", 1.0),
    ("<answer>$5</answer>", "5", 1.0),
    ("<answer>0.5</answer>", "1/2", 1.0),
    ("So 13.", "12", 0.0),
    ("no idea", "12", 0.0),
    ("<answer>paris.</answer>", "Paris", 1.0),  # normalised text
    ("<answer>Lyon</answer>", "Paris", 0.0),
    ("... #### 72", "She sold 48 + 24 = 72 clips.\n#### 72", 1.0),  # GSM8K ground truth with working
])
def test_exact_match(response, answer, reward):
    assert exact_match(response, task(answer)) == reward


def test_tasks_may_be_objects():
    assert exact_match("12", SimpleNamespace(answer="12", metadata={})) == 1.0
    task_object = SimpleNamespace(answer="", metadata={"numbers": [3, 4], "target": 7})
    assert countdown("<answer>3 + 4</answer>", task_object) == 1.0


def test_numeric_tolerance():
    assert numeric("about 3.14159", task("3.14"), tolerance=0.01) == 1.0
    assert numeric("about 3.16", task("3.14"), tolerance=0.01) == 0.0
    assert numeric("3.1400000001", task("3.14")) == 1.0  # default tolerance 1e-6
    assert numeric("pi", task("3.14")) == 0.0


CD = task(numbers=[3, 4, 5, 6], target=14)


@pytest.mark.parametrize("response, reward", [
    ("<answer>(5 - 3) * 4 + 6</answer>", 1.0),  # 2·4 + 6
    ("<answer>5 + 3 + 6</answer>", 1.0),  # a subset is allowed, each at most once
    ("I get 5 + 3 + 6 = 14", 0.0),  # untagged: the last line, before '=' is 'I get 5 + 3 + 6': not an expression
    ("working\n5 + 3 + 6 = 14", 1.0),  # untagged: last line, the part before '='
    ("<answer>6 + 6 + 3 - 1</answer>", 0.0),  # 6 used twice, 1 not given
    ("<answer>5 * 3 - 1</answer>", 0.0),  # 1 is not among the numbers
    ("<answer>4 * 3</answer>", 0.0),  # 12, not 14
    ("<answer>(6 / 4) * 4 + 5</answer>", 0.0),  # 4 used twice (value 11 anyway)
    ("<answer>6 / 4 * 4</answer>", 0.0),
    ("<answer>3 ** 2 + 5</answer>", 0.0),  # power is not allowed
    ("<answer>-3 + 5 + 6 + 6</answer>", 0.0),  # unary minus is not allowed
    ("<answer>__import__('os')</answer>", 0.0),
    ("<answer>6 / (4 - 4)</answer>", 0.0),  # division by zero scores 0, does not raise
    ("<answer>5.0 + 3 + 6</answer>", 0.0),  # only the given integers
    ("<answer>" + "(" * 500 + "3" + ")" * 500 + "</answer>", 0.0),
])
def test_countdown(response, reward):
    assert countdown(response, CD) == reward


def test_countdown_division_is_exact_and_use_all():
    t = task(numbers=[6, 4, 10], target=25)
    assert countdown("<answer>10 * 10 / 4</answer>", t) == 0.0
    assert countdown("<answer>(10 / 4) * 10</answer>", task(numbers=[10, 4, 10], target=25)) == 1.0  # 2.5·10 exactly
    t = task(numbers=[3, 4, 5], target=7)
    assert countdown("<answer>3 + 4</answer>", t) == 1.0
    assert countdown("<answer>3 + 4</answer>", t, use_all=True) == 0.0
    assert countdown("<answer>(5 - 3) * 4 - 1</answer>", t, use_all=True) == 0.0
    assert countdown("<answer>5 * 4 - 3 * 4 - 1</answer>", t, use_all=True) == 0.0
    assert countdown("<answer>(3 + 4) * 5 / 5</answer>", task(numbers=[3, 4, 5, 5], target=7), use_all=True) == 1.0


@pytest.mark.parametrize("response, plain, think", [
    ("<answer>12</answer>", 1.0, 0.0),
    ("  <think>7 plus 5</think>\n<answer>12</answer>\n", 1.0, 1.0),
    ("<think>hmm</think><answer></answer>", 0.0, 0.0),  # empty answer
    ("The answer is <answer>12</answer>", 0.0, 0.0),  # text outside the tags
    ("<answer>12</answer><think>late</think>", 0.0, 0.0),  # think must come first
    ("12", 0.0, 0.0),
])
def test_format(response, plain, think):
    assert format_reward(response, task()) == plain
    assert format_reward(response, task(), think=True) == think


def test_build_reward_keeps_components_apart():
    reward = build_reward("exact_match")
    assert reward("<answer>12</answer>", task("12")) == (1.0, {"exact_match": 1.0})
    reward = build_reward({"exact_match": 1.0, "format": {"weight": 0.5, "think": True}, "numeric": {"tolerance": 1}})
    total, components = reward("<answer>13</answer>", task("12"))
    # components are the raw scores; total = 1·0 + .5·0 (no think block) + 1·1 (|13-12| <= 1)
    assert components == {"exact_match": 0.0, "format": 0.0, "numeric": 1.0} and total == 1.0
    total, components = build_reward({"exact_match": 2, "format": 0.5})("<answer>12</answer>", task("12"))
    assert total == 2.5 and components == {"exact_match": 1.0, "format": 1.0}


def test_build_reward_rejects_bad_specs():
    with pytest.raises(
        KeyError,
        match="unknown reward fn 'nope'; known: countdown, exact_match, format, llm_judge, numeric, reward_model",
    ):
        build_reward({"exact_match": 1, "nope": 1})
    with pytest.raises(TypeError, match="reward fn 'numeric'.*'tol'"):
        build_reward({"numeric": {"tol": 0.5}})
    with pytest.raises(ValueError, match="must be a number"):
        build_reward({"format": True})
    with pytest.raises(ValueError, match="non-empty"):
        build_reward({})


@pytest.mark.parametrize("name", REWARD_FNS.names())
def test_every_reward_fn_declares_what_its_params_may_be(name):
    """A param is a request to a shared worker, checked at launch (config.reward_fn_issues): typed,
    counts bounded above, text held to a check, choices or a model directory."""
    import inspect

    fn = REWARD_FNS.get(name)
    params = list(inspect.signature(fn, eval_str=True).parameters.values())[2:]
    assert set(fn.rules) <= {p.name for p in params}  # no rule for a param the fn does not take
    for param in params:
        rules = fn.rules.get(param.name, {})
        assert param.annotation in (bool, int, float, str), (name, param.name)
        if param.annotation is int:
            assert rules.get("le") is not None, (name, param.name)
        if param.annotation is str:
            assert {"check", "choices", "model"} & set(rules), (name, param.name)


def test_a_judge_rubric_takes_only_plain_placeholders():
    from workers.rft.rewards.models import DEFAULT_RUBRIC, rubric_problem

    assert rubric_problem(DEFAULT_RUBRIC) is None
    assert rubric_problem("{{literal}} {response} out of {max_score}, {max_score} best") is None
    assert "takes no format spec" in rubric_problem("{response!r}")
    assert "is not a placeholder" in rubric_problem("{0} {response}")
    assert "is not a template" in rubric_problem("{response")
    assert "at most 20000 characters" in rubric_problem("{response}" + "x" * 20_000)
