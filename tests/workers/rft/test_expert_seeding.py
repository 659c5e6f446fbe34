"""The expert taskset is seeded into a run's buffer once, whatever else is expert data by then."""
import pytest

from workers.rft.experience import Experience
from workers.rft.loop import TRAINER, Loop
from workers.rft.memory import memory_stores
from workers.rft.pipelines.experience_ops import promote_to_expert

from .test_sync import small_config

pytestmark = pytest.mark.usefixtures("data_dir")


def test_rollouts_promoted_before_the_trainer_started_do_not_stop_the_seeding(tmp_path):
    """A split run's explorer may store promote_to_expert's copies before its trainer starts: MIX
    then trained on those copies alone, the expert taskset never seeded."""
    config = small_config(algorithm={"name": "mix"}, buffer={"expert_taskset": "arithmetic:n=20"})
    stores = memory_stores(config)
    promoted, _ = promote_to_expert([_rollout(task_id=k) for k in range(3)], None, min_reward=1.0)
    stores.buffer.write(promoted)
    assert stores.buffer.count(sources=("expert",)) == 3
    Loop(config, stores, tmp_path, components=(TRAINER,))
    assert stores.buffer.count(sources=("expert",)) == 3 + 20
    Loop(config, stores, tmp_path, components=(TRAINER,))  # a restart: seeded already
    assert stores.buffer.count(sources=("expert",)) == 3 + 20


def _rollout(task_id):
    return Experience(task_id=task_id, group_id=f"0-{task_id}", rollout_index=0, prompt_ids=[1], response_ids=[2],
                      action_mask=[1], reward=1.0)
