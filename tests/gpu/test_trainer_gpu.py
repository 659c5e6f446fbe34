"""The trainer on GPUs: bf16 autocast over fp32 master weights, and trainer.strategy 'ddp' and
'fsdp' (FSDP2, with its settings) over NCCL.
Skipped without CUDA (CI is CPU-only). Needs only torch, transformers, pytest: no Django, no
conftest (the repository's import Django), so it runs as

    python -m pytest --noconftest -p no:django -o addopts="" -m gpu tests/gpu

The rank functions live at module level: `launch` spawns fresh interpreters, which import them
from here by name."""
import pytest
import torch

from workers.rft.config import RunConfig
from workers.rft.distributed import launch
from workers.rft.experience import Experience
from workers.rft.memory import InMemoryBuffer
from workers.rft.models import build_tiny_model, load_policy, load_tokenizer
from workers.rft.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def rollouts(tokenizer, n: int = 24) -> list[Experience]:
    """Groups of two: the right sum (advantage +1) and a wrong one (-1), of different lengths."""
    batch = []
    for i in range(n // 2):
        a, b = i % 10, (3 * i) % 10
        prompt = tokenizer(f"What is {a} + {b}?")["input_ids"]
        for index, (answer, advantage) in enumerate([(a + b, 1.0), (a + b + 11, -1.0)]):
            response = tokenizer(str(answer))["input_ids"] + [tokenizer.eos_token_id]
            batch.append(Experience(
                task_id=i, group_id=str(i), rollout_index=index, prompt_ids=prompt, response_ids=response,
                action_mask=[1] * len(response), source="rollout", reward=advantage, advantage=advantage,
                explorer_step=0, model_version=0,
            ))
    return batch


def build(tiny_path, ranks=None, dtype: str = "float32", strategy: str = "ddp", fsdp: dict | None = None) -> Trainer:
    trainer_section = {"lr": 1e-3, "batch_size": 8, "micro_batch_size": 3}
    if ranks is not None:
        trainer_section.update(strategy=strategy, num_processes=ranks.world_size)
    if fsdp is not None:
        trainer_section["fsdp"] = fsdp
    config = RunConfig.from_dict({
        "model": {"path": str(tiny_path), "dtype": dtype, "device": "cuda"},
        "algorithm": {"name": "grpo", "repeat_times": 2},
        "trainer": trainer_section,
    })
    tokenizer = load_tokenizer(tiny_path)
    buffer = None
    if ranks is None or ranks.is_leader:
        buffer = InMemoryBuffer()
        buffer.write(rollouts(tokenizer))
    return Trainer(config, load_policy(tiny_path, CUDA), tokenizer, buffer, ranks=ranks)


def train(ranks, tiny_path, steps: int = 2, dtype: str = "float32", strategy: str = "ddp",
          fsdp: dict | None = None) -> dict | None:
    """Rank function (and the lone trainer): `steps` steps; the leader's metrics and (full) weights."""
    trainer = build(tiny_path, ranks, dtype, strategy, fsdp)
    if ranks is not None and not ranks.is_leader:
        trainer.follow()
        return None
    metrics = [trainer.train_step() for _ in range(steps)]
    weights = trainer.full_state()["policy"]  # under fsdp gathered from the shards (the followers take part)
    trainer.release_ranks()
    return {"metrics": metrics, "weights": {n: t.detach().cpu() for n, t in weights.items()}}


def test_bf16_autocast_trains_fp32_master_weights_close_to_fp32(tiny_path):
    fp32, bf16 = build(tiny_path), build(tiny_path, dtype="bfloat16")
    assert bf16.autocast is torch.bfloat16
    a, b = fp32.train_step(), bf16.train_step()
    assert all(p.dtype is torch.float32 for p in bf16.policy.parameters())
    assert b["loss"] == pytest.approx(a["loss"], rel=2e-2, abs=1e-3)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=5e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_ddp_over_nccl_takes_the_step_one_gpu_takes(tiny_path):
    alone = train(None, tiny_path)
    leader = launch(train, 2, tiny_path, device_type="cuda")[0]
    for one, two in zip(alone["metrics"], leader["metrics"]):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name, value in alone["weights"].items():
        # As on CPU (tests/workers/rft/test_distributed.py): Adam turns rounding noise in
        # near-zero gradients into steps of up to a fraction of lr.
        torch.testing.assert_close(leader["weights"][name], value, rtol=1e-5, atol=1e-4, msg=name)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
@pytest.mark.parametrize("fsdp", [
    {}, {"reshard_after_forward": False}, {"cpu_offload": True}, {"activation_checkpointing": True},
], ids=["defaults", "no_reshard", "cpu_offload", "activation_checkpointing"])
def test_fsdp_over_nccl_in_bf16_takes_the_step_one_gpu_takes(tiny_path, fsdp):
    """bf16 autocast on both sides over fp32 sharded weights: the same per-micro-batch numerics,
    the gradients summed in another order."""
    alone = train(None, tiny_path, dtype="bfloat16")
    leader = launch(train, 2, tiny_path, 2, "bfloat16", "fsdp", fsdp, device_type="cuda")[0]
    for one, two in zip(alone["metrics"], leader["metrics"]):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    for name, value in alone["weights"].items():
        torch.testing.assert_close(leader["weights"][name], value, rtol=1e-4, atol=1e-4, msg=name)
