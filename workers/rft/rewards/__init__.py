"""Rule-based reward fns, looked up by name (explorer.reward_fn)."""
from workers.rft.rewards import answer, countdown, models  # noqa: F401  (registers the fns)
from workers.rft.rewards.base import CAUSAL_LM, REWARD_FNS, ReadLimits, build_reward, task_field

__all__ = ["CAUSAL_LM", "REWARD_FNS", "ReadLimits", "build_reward", "task_field"]
