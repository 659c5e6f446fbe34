"""Text environments: action parsing, the toy-text wrappers, scripted experts, user plug-ins."""
import pytest

from workers.rft.engines import SamplingParams
from workers.rft.environments import ENVIRONMENTS, Step, TextEnvironment, parse_action
from workers.rft.experience import Task
from workers.rft.memory import load_tasks
from workers.rft.workflows import WORKFLOWS, workflow_args_problems

from .test_multi_turn import ScriptedEngine


def test_actions_are_parsed_from_the_whole_reply_or_the_last_tag():
    actions = ["left", "down", "right", "up"]
    assert parse_action("right", actions) == 2
    assert parse_action("  Down. ", actions) == 1
    assert parse_action("3", actions) == 3
    assert parse_action("I think <action>up</action>, no: <action>left</action>", actions) == 0
    for bad in ("I go right", "", "4", "rightt", "<action>jump</action>"):
        assert parse_action(bad, actions) is None


def play(env, replies, seed=0):
    env.reset(seed, None)
    steps = [env.step(reply) for reply in replies]
    return steps


@pytest.mark.parametrize("name", ["frozenlake", "cliffwalking", "taxi"])
def test_scripted_experts_solve_the_deterministic_environments(name):
    env = ENVIRONMENTS.get(name)()
    env.reset(3, None)
    replies = env.expert_replies()
    assert replies
    steps = play(env, replies, seed=3)
    assert steps[-1].done and steps[-1].success and not any(s.done for s in steps[:-1])
    assert not any(s.invalid for s in steps)


def test_frozenlake_renders_the_board_and_falls_into_holes():
    env = ENVIRONMENTS.get("frozenlake")()
    assert env.reset(0, None) == "PFFF\nFHFH\nFFFH\nHFFG"
    first = env.step("down")
    assert first == Step("SFFF\nPHFH\nFFFH\nHFFG")
    hole = env.step("right")
    assert hole.done and not hole.success and hole.reward == 0.0
    invalid = ENVIRONMENTS.get("frozenlake")()
    invalid.reset(0, None)
    step = invalid.step("fly")
    assert step.invalid and not step.done and step.observation.endswith("PFFF\nFHFH\nFFFH\nHFFG")
    # Slippery ice is random: no scripted expert.
    slippery = ENVIRONMENTS.get("frozenlake")(is_slippery=True)
    slippery.reset(0, None)
    assert slippery.expert_replies() is None
    eight = ENVIRONMENTS.get("frozenlake")(map_name="8x8")
    assert len(eight.reset(0, None).splitlines()) == 8


def test_cliffwalking_taxi_and_blackjack_speak_text():
    cliff = ENVIRONMENTS.get("cliffwalking")()
    assert cliff.reset(0, None).splitlines()[-1] == "PCCCCCCCCCCG"
    fall = cliff.step("right")
    assert fall.reward == -100.0 and not fall.done and fall.observation.splitlines()[-1] == "PCCCCCCCCCCG"
    taxi = ENVIRONMENTS.get("taxi")()
    assert taxi.reset(0, None) == "Taxi at row 3, column 0. Passenger waiting at B. Destination Y."
    assert taxi.step("pickup").reward == -10.0  # the passenger is not here
    assert taxi.step("north").observation == "Taxi at row 2, column 0. Passenger waiting at B. Destination Y."
    blackjack = ENVIRONMENTS.get("blackjack")()
    assert blackjack.reset(0, None) == "Your hand totals 11. The dealer shows 10."
    end = blackjack.step("stick")
    assert end.done and end.reward in (-1.0, 0.0, 1.0) and end.success == (end.reward > 0)
    assert blackjack.expert_replies() is None


def test_same_seed_same_episode():
    first, second = (ENVIRONMENTS.get("blackjack")() for _ in range(2))
    assert first.reset(11, None) == second.reset(11, None)
    moves = ["hit", "hit", "stick"]
    assert [s.reward for s in play(first, moves, 11)] == [s.reward for s in play(second, moves, 11)]


@ENVIRONMENTS.register("test-guess-number")
class GuessNumber(TextEnvironment):
    """A user plug-in: guess the task's number; 'higher'/'lower' hints; settings by keyword."""

    instructions = "Guess my number. Reply with the number only."

    def __init__(self, hint: bool = True):
        self.hint = hint

    def reset(self, seed, task):
        self.secret = task.metadata["secret"]
        return "I am thinking of a number between 1 and 9."

    def step(self, reply):
        if not reply.strip().isdigit():
            return Step("Numbers only.", invalid=True)
        guess = int(reply)
        if guess == self.secret:
            return Step("", 1.0, done=True, success=True)
        return Step(("higher" if guess < self.secret else "lower") if self.hint else "no")


def test_a_user_environment_plays_by_name(tokenizer):
    assert workflow_args_problems("multi_turn", {"env": "test-guess-number", "env_args": {"hint": False}}) == []
    assert "unexpected keyword argument 'colour'" in dict(
        workflow_args_problems("multi_turn", {"env": "test-guess-number", "env_args": {"colour": 1}})
    )["env_args"]

    def binary_search(call, row, text):
        low, high = 1, 9
        for line in text.split("<|im_start|>"):  # replay the hints the conversation holds
            if line.startswith("assistant\n") and line[len("assistant\n"):].split("<")[0].strip().isdigit():
                last = int(line[len("assistant\n"):].split("<")[0])
            if line.startswith("user\nhigher"):
                low = last + 1
            if line.startswith("user\nlower"):
                high = last - 1
        return str((low + high) // 2)

    workflow = WORKFLOWS.get("multi_turn")(
        ScriptedEngine(tokenizer, binary_search), None, tokenizer=tokenizer, env="test-guess-number"
    )
    (exp,) = workflow.run_batch([Task(id=0, prompt="", metadata={"secret": 7})], SamplingParams(max_new_tokens=4), 0)
    assert [m["content"] for m in exp.messages if m["role"] == "assistant"] == ["5", "7"]
    assert exp.messages[2]["content"] == "higher" and exp.reward == 1.0


def test_episodes_taskset_gives_each_task_a_seed():
    tasks = load_tasks("episodes:n=5,seed=3")
    assert len(tasks) == 5 and len({t.metadata["seed"] for t in tasks}) == 5
    assert [t.metadata for t in tasks] == [t.metadata for t in load_tasks("episodes:n=5,seed=3")]
    assert load_tasks("episodes:n=1,prompt=Play well.")[0].prompt == "Play well."
