"""Steps shared by several explorers (explorer.engine_num), engine side: the step's metrics merged
from the explorers' parts are the metrics one explorer logs over the same rollouts; the config
and the headless CLI say where several explorers run. (Over Postgres and real workers:
tests/apps/runs/test_explorer_claims.py, tests/workers/test_explorers.py.)"""
import json
import random

import pytest

from workers.rft.__main__ import main
from workers.rft.config import ConfigError, RunConfig
from workers.rft.experience import Experience
from workers.rft.explorer import merge_parts, rollout_metrics

from .conftest import make_config


def rollout(task: int, i: int, reward: float, length: int, truncated: bool) -> Experience:
    return Experience(task_id=task, group_id=f"0-{task}", rollout_index=i, prompt_ids=[1], response_ids=[2] * length,
                      action_mask=[1] * length, reward=reward, reward_components={"exact_match": reward},
                      metadata={"finish_reason": "length" if truncated else "stop"})


def part(experiences, worker, seconds) -> dict:
    means = rollout_metrics(experiences)
    return {"rollouts": means.pop("rollouts"), "means": means, "tokens": sum(len(e.response_ids) for e in experiences),
            "counts": {"written": len(experiences), "advantage/zero_std_groups": 1}, "generate_seconds": seconds,
            "worker": f"host:{worker}", "explorer": worker}


def test_merged_parts_are_one_explorers_metrics_over_all_rollouts():
    rng = random.Random(0)
    groups = [[rollout(t, i, rng.choice([0.0, 1.0, 0.5]), rng.randint(1, 9), rng.random() < 0.3) for i in range(4)]
              for t in range(6)]
    whole = rollout_metrics([e for group in groups for e in group])
    # Explorer a rolled out 4 groups in two claims (1 s + 2 s), b 2 groups in one (2.5 s).
    parts = [part(groups[0] + groups[1], "a", 1.0), part(groups[2], "b", 2.5), part(groups[3] + groups[4] + groups[5],
                                                                                     "a", 2.0)]
    merged = merge_parts(parts)
    for key in ("reward_mean", "reward_std", "response_length", "truncated_frac", "exact_match", "rollouts"):
        assert merged[key] == pytest.approx(whole[key], rel=1e-12), key
    assert merged["written"] == 24 and merged["advantage/zero_std_groups"] == 3
    tokens = sum(len(e.response_ids) for group in groups for e in group)
    assert merged["tokens_per_s"] == pytest.approx(tokens / 3.0)  # a's 3 s: the step took as long as its slowest
    assert merged["explorers"] == 2
    a_tokens = sum(len(e.response_ids) for group in groups[:2] + groups[3:] for e in group)
    assert merged["tokens_per_s/a"] == pytest.approx(a_tokens / 3.0)  # one line per explorer
    assert merged["tokens_per_s/b"] == pytest.approx((tokens - a_tokens) / 2.5)


def test_merged_parts_say_how_each_explorer_spent_its_time():
    experiences = [rollout(0, i, 1.0, 3, False) for i in range(4)]
    # a loaded weights for 0.5 s and waited a quarter of its time since its last part; b had
    # loaded nothing and, on its first part, has no idle share yet.
    parts = [part(experiences, "a", 1.0) | {"sync_seconds": 0.5, "idle_share": 0.25},
             part(experiences, "b", 1.0) | {"sync_seconds": 0.0},
             part(experiences, "a", 1.0) | {"sync_seconds": 0.0, "idle_share": 0.75}]
    merged = merge_parts(parts)
    assert merged["sync_seconds/a"] == 0.5 and merged["sync_seconds/b"] == 0.0 and merged["sync_seconds"] == 0.5
    assert merged["idle_share/a"] == 0.5 and "idle_share/b" not in merged and merged["idle_share"] == 0.5


@pytest.mark.parametrize("patch", [
    {"synchronizer": {"method": "memory"}},
    # the default lr: mode explore refuses a trainer's settings (config_rules.TRAINER_ONLY)
    {"synchronizer": {"method": "checkpoint"}, "mode": "explore", "trainer": {"lr": 1e-5}},
])
def test_several_explorers_need_workers_of_their_own(patch):
    with pytest.raises(ConfigError) as refused:
        make_config(explorer={"engine_num": 2}, **patch)
    (issue,) = refused.value.errors
    assert issue.key == "explorer.engine_num" and "synchronizer.method 'checkpoint'" in issue.message


def test_the_headless_cli_runs_one_explorer_and_says_where_several_run(tmp_path, capsys):
    config = make_config(explorer={"engine_num": 2}, synchronizer={"method": "checkpoint"})
    path = tmp_path / "two.json"
    path.write_text(json.dumps(config.to_dict()))
    assert main(["run", str(path)]) == 2
    assert "explorer.engine_num is 2: several explorers are workers of a run launched from the dashboard" in \
        capsys.readouterr().err
    assert RunConfig.from_dict(config.to_dict()).explorer.engine_num == 2  # valid: the dashboard runs it
