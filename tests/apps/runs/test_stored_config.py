"""A run stored before a rule refused one of its keys as read by nothing still resumes."""
import pytest

from apps.runs.config_keys import stored_config
from workers.rft.config import ConfigError, RunConfig


def test_a_key_refused_since_as_unread_goes_back_to_its_default_and_the_rest_stays():
    launched = {"algorithm": {"name": "grpo"}, "buffer": {"expert_taskset": "gsm8k-expert"},
                "feedback": {"source_runs": [3]}, "trainer": {"lr": 3e-6}}
    with pytest.raises(ConfigError, match="buffer.expert_taskset"):
        RunConfig.from_dict(launched)  # what a resume used to do: the run failed naming the key
    config = stored_config(launched)
    assert config.buffer.expert_taskset is None and config.feedback.source_runs == []
    assert config.trainer.lr == 3e-6 and launched["buffer"]["expert_taskset"] == "gsm8k-expert"  # stored as it was


def test_other_problems_are_still_named():
    with pytest.raises(ConfigError, match="trainer.lr"):
        stored_config({"trainer": {"lr": "fast"}})
