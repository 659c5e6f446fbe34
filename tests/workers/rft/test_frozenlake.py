"""An agent learns FrozenLake (4x4, not slippery) from the tiny random model: the example config
workers/rft/examples/frozenlake_mix.yaml, run headless. Success rate climbs from 0."""
from pathlib import Path

import pytest

from workers.rft.config import load_config
from workers.rft.loop import Loop
from workers.rft.memory import memory_stores

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("data_dir")]

EXAMPLE = Path(__file__).resolve().parents[3] / "workers/rft/examples/frozenlake_mix.yaml"


@pytest.mark.timeout(2400)  # ~30 trainer steps on long trajectories: minutes on a busy 2-core machine
def test_frozenlake_success_rate_goes_up(tmp_path):
    config = load_config(EXAMPLE)
    stores = memory_stores(config)
    assert Loop(config, stores, tmp_path).run() == "completed"

    greedy = stores.metrics.series("eval", "episode/success")
    sampled = stores.metrics.series("explorer", "episode/success")
    print("greedy success by explorer step:", greedy)
    print("sampled success by explorer step:", [(step, round(value, 3)) for step, value in sampled])
    assert greedy[0] == (0, 0.0)  # the random model never reaches the goal
    assert greedy[-1][1] >= 0.5, greedy
    first, last = sampled[:10], sampled[-10:]
    assert sum(v for _, v in last) > sum(v for _, v in first), sampled
    # The expert data it imitates is what the explorer now plays: few invalid actions are left.
    invalid = stores.metrics.series("explorer", "episode/invalid_actions")
    assert invalid[0][1] == 1.0 and sum(v for _, v in invalid[-10:]) < sum(v for _, v in invalid[:10])
