"""LoRA on a GPU: one GRPO step in bf16 autocast over fp32 adapters moves the adapters alone, close
to the same step in fp32. Skipped without CUDA; no Django, no conftest (see test_trainer_gpu.py):

    python -m pytest --noconftest -p no:django -o addopts="" -m gpu tests/gpu
"""
import pytest
import torch

from workers.rft.config import RunConfig
from workers.rft.experience import Experience
from workers.rft.memory import InMemoryBuffer
from workers.rft.models import add_lora, build_tiny_model, load_policy, load_tokenizer, merged_state_dict
from workers.rft.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def rollouts(tokenizer, n: int = 16) -> list[Experience]:
    """Groups of two: the right sum (advantage +1) and a wrong one (-1)."""
    batch = []
    for i in range(n // 2):
        prompt = tokenizer(f"What is {i % 10} + 3?")["input_ids"]
        for index, (answer, advantage) in enumerate([(i % 10 + 3, 1.0), (i % 10 + 14, -1.0)]):
            response = tokenizer(str(answer))["input_ids"] + [tokenizer.eos_token_id]
            batch.append(Experience(
                task_id=i, group_id=str(i), rollout_index=index, prompt_ids=prompt, response_ids=response,
                action_mask=[1] * len(response), source="rollout", reward=advantage, advantage=advantage,
                explorer_step=0, model_version=0,
            ))
    return batch


def build(tiny_path, dtype: str) -> Trainer:
    config = RunConfig.from_dict({
        "seed": 0,
        "model": {"path": str(tiny_path), "dtype": dtype, "device": "cuda", "lora": {"r": 8, "alpha": 16}},
        "algorithm": {"name": "grpo", "repeat_times": 2, "kl": {"fn": "k3", "coef": 0.1}},
        "trainer": {"lr": 1e-2, "batch_size": 8, "micro_batch_size": 4},
    })
    tokenizer = load_tokenizer(tiny_path)
    buffer = InMemoryBuffer()
    buffer.write(rollouts(tokenizer))
    torch.manual_seed(0)  # the same lora_A draws on both sides
    policy = add_lora(load_policy(tiny_path, CUDA), config.model.lora)
    return Trainer(config, policy, tokenizer, buffer)


def test_a_lora_step_in_bf16_autocast_trains_the_fp32_adapters(tiny_path):
    fp32, bf16 = build(tiny_path, "float32"), build(tiny_path, "bfloat16")
    assert bf16.autocast is torch.bfloat16
    base = {k: v.clone() for k, v in merged_state_dict(bf16.policy).items()}
    a, b = fp32.train_step(), bf16.train_step()
    assert all(p.dtype is torch.float32 for p in bf16.policy.parameters())
    assert b["trainable_share"] < 0.2 and b["kl"] == pytest.approx(0.0, abs=1e-3)  # policy == base before the step
    assert b["loss"] == pytest.approx(a["loss"], rel=2e-2, abs=1e-3)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=5e-2)
    merged = merged_state_dict(bf16.policy)
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)  # only adapted layers moved
    assert torch.cuda.max_memory_allocated() > 0
