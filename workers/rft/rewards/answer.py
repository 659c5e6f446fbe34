"""Rewards that check the final answer of a response against the task's answer, and its format."""
import math
import re
from fractions import Fraction

from workers.rft.rewards.base import reward_fn, task_field

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


def tagged_answer(text: str) -> str | None:
    """The part inside the last <answer>...</answer>, else after the last '####' (GSM8K style)."""
    tagged = ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return None


def extract_answer(response: str) -> str:
    """A response's final answer: tagged, else its last number, else the whole text."""
    answer = tagged_answer(response)
    if answer is not None:
        return answer
    numbers = NUMBER.findall(response)
    return numbers[-1] if numbers else response.strip()


def parse_number(text: str) -> Fraction | None:
    """'1,234', '$12', '12.', '-0.5', '3/4' -> exact Fraction; anything else -> None."""
    text = text.strip().replace(",", "").lstrip("$").rstrip(".")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def normalise(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .")


def _truth(task) -> str:
    truth = str(task_field(task, "answer", ""))
    tagged = tagged_answer(truth)  # a ground truth may carry its own working, e.g. GSM8K '... #### 72'
    return truth.strip() if tagged is None else tagged


@reward_fn("exact_match")
def exact_match(response: str, task) -> float:
    """1.0 when the final answer equals the task's: numerically when both are numbers, else as normalised text."""
    predicted, truth = extract_answer(response), _truth(task)
    a, b = parse_number(predicted), parse_number(truth)
    if a is not None and b is not None:
        return float(a == b)
    return float(normalise(predicted) == normalise(truth))


@reward_fn("numeric", tolerance={"ge": 0})
def numeric(response: str, task, tolerance: float = 1e-6) -> float:
    """1.0 when the final answer is a number within `tolerance` of the task's answer."""
    a, b = parse_number(extract_answer(response)), parse_number(_truth(task))
    if a is None or b is None:
        return 0.0
    return float(math.fabs(a - b) <= tolerance)


THINK_THEN_ANSWER = re.compile(r"\s*<think>.+?</think>\s*<answer>.+?</answer>\s*", re.DOTALL)
ANSWER_ONLY = re.compile(r"\s*(?:<think>.+?</think>\s*)?<answer>.+?</answer>\s*", re.DOTALL)


@reward_fn("format")
def format_reward(response: str, task, think: bool = False) -> float:
    """1.0 when the response is a non-empty <answer>...</answer>, optionally after a <think>...</think>
    block; with think=True the <think> block is required. Nothing else may surround them."""
    pattern = THINK_THEN_ANSWER if think else ANSWER_ONLY
    return float(pattern.fullmatch(response) is not None)
