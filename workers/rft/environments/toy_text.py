"""gymnasium's toy-text environments as text environments.

Each renders its state as a few lines of text and takes one action word per reply (see
`base.parse_action`). The deterministic ones (FrozenLake and CliffWalking when not slippery,
Taxi when not rainy) have a scripted expert: the shortest path found by breadth-first search over
the environment's own transition table, used for SFT warm-up.
"""
from collections import deque

import gymnasium

from .base import ENVIRONMENTS, Step, TextEnvironment, parse_action


class GymTextEnvironment(TextEnvironment):
    gym_id: str
    actions: list[str]  # reply words, in the order of gymnasium's action ids

    def __init__(self, **gym_kwargs):
        self.env = gymnasium.make(self.gym_id, **gym_kwargs)
        self.state = None

    def render(self, state) -> str:
        raise NotImplementedError

    def succeeded(self, reward: float, terminated: bool) -> bool:
        return terminated and reward > 0

    def reset(self, seed: int | None, task) -> str:
        self.state, _ = self.env.reset(seed=seed)
        return self.render(self.state)

    def step(self, reply: str) -> Step:
        action = parse_action(reply, self.actions)
        if action is None:
            return Step(
                f"Invalid action. Reply with one of: {', '.join(self.actions)}.\n{self.render(self.state)}",
                invalid=True,
            )
        self.state, reward, terminated, truncated, _ = self.env.step(action)
        done = bool(terminated or truncated)
        return Step(
            "" if done else self.render(self.state), float(reward), done, success=self.succeeded(reward, terminated)
        )

    def expert_replies(self) -> list[str] | None:
        """Shortest action sequence from the current state to success; None when the transitions
        are random (slippery, rainy) or no path exists."""
        table = getattr(self.env.unwrapped, "P", None)
        if table is None:  # no transition table (Blackjack)
            return None
        came_from = {self.state: None}
        queue = deque([self.state])
        while queue:
            state = queue.popleft()
            for action in range(len(self.actions)):
                if len(table[state][action]) != 1:
                    return None
                _, after, reward, terminated = table[state][action][0]
                if self.succeeded(reward, terminated):
                    path = [action]
                    while came_from[state] is not None:
                        state, previous_action = came_from[state]
                        path.append(previous_action)
                    return [self.actions[a] for a in reversed(path)]
                if not terminated and after not in came_from:
                    came_from[after] = (state, action)
                    queue.append(after)
        return None

    def close(self) -> None:
        self.env.close()


def grid_with_agent(rows: list[str], row: int, col: int, agent: str = "P") -> str:
    rows = list(rows)
    rows[row] = rows[row][:col] + agent + rows[row][col + 1 :]
    return "\n".join(rows)


@ENVIRONMENTS.register("frozenlake")
class FrozenLake(GymTextEnvironment):
    gym_id = "FrozenLake-v1"
    actions = ["left", "down", "right", "up"]
    instructions = (
        "You are P on a frozen lake: S start, F frozen, H hole, G goal. "
        "Reach G without falling into a hole. Reply with one move: left, down, right or up."
    )

    def __init__(self, map_name: str = "4x4", is_slippery: bool = False, desc: list[str] | None = None):
        super().__init__(map_name=map_name, is_slippery=is_slippery, desc=desc)
        self.rows = ["".join(c.decode() for c in row) for row in self.env.unwrapped.desc]

    def render(self, state) -> str:
        return grid_with_agent(self.rows, *divmod(int(state), len(self.rows[0])))


@ENVIRONMENTS.register("cliffwalking")
class CliffWalking(GymTextEnvironment):
    gym_id = "CliffWalking-v1"
    actions = ["up", "right", "down", "left"]
    instructions = (
        "You are P on a cliff edge: o ground, C cliff, G goal. Stepping on C sends you back to the "
        "start. Reach G. Reply with one move: up, right, down or left."
    )
    ROWS = ["o" * 12] * 3 + ["o" + "C" * 10 + "G"]

    def __init__(self, is_slippery: bool = False):
        super().__init__(is_slippery=is_slippery)

    def render(self, state) -> str:
        return grid_with_agent(self.ROWS, *divmod(int(state), 12))

    def succeeded(self, reward: float, terminated: bool) -> bool:
        return terminated  # only the goal terminates


@ENVIRONMENTS.register("taxi")
class Taxi(GymTextEnvironment):
    gym_id = "Taxi-v3"
    actions = ["south", "north", "east", "west", "pickup", "dropoff"]
    STOPS = "RGYB"
    instructions = (
        "You drive a taxi on this 5x5 map (| is a wall, : a passage; R, G, Y, B are stops):\n"
        "+---------+\n|R: | : :G|\n| : | : : |\n| : : : : |\n| | : | : |\n|Y| : |B: |\n+---------+\n"
        "Pick the passenger up at their stop and drop them off at the destination. "
        "Reply with one action: south, north, east, west, pickup or dropoff."
    )

    def __init__(self, is_rainy: bool = False, fickle_passenger: bool = False):
        super().__init__(is_rainy=is_rainy, fickle_passenger=fickle_passenger)

    def render(self, state) -> str:
        row, col, passenger, destination = self.env.unwrapped.decode(int(state))
        where = "in the taxi" if passenger == 4 else f"waiting at {self.STOPS[passenger]}"
        return f"Taxi at row {row}, column {col}. Passenger {where}. Destination {self.STOPS[destination]}."


@ENVIRONMENTS.register("blackjack")
class Blackjack(GymTextEnvironment):
    gym_id = "Blackjack-v1"
    actions = ["stick", "hit"]
    instructions = "We play blackjack against the dealer. Reply with one action: stick or hit."

    def __init__(self, natural: bool = False, sab: bool = False):
        super().__init__(natural=natural, sab=sab)

    def render(self, state) -> str:
        total, dealer, usable_ace = state
        return f"Your hand totals {total}{' with a usable ace' if usable_ace else ''}. The dealer shows {dealer}."
