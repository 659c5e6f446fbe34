"""synchronizer.method nccl on GPUs: the trainer on cuda:0 sends its versions over NCCL to an
explorer on cuda:1, whose greedy answers then equal the trainer model's, before and after a sync
(the tiny model ties its output head to its embedding: the head arrives with it). With vLLM
installed, the same through the vLLM engine. Skipped without two GPUs (NCCL takes one a rank).

    python -m pytest --noconftest -p no:django -o addopts="" -m gpu tests/gpu
"""
import importlib.util
import time

import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.memory import InMemoryWeightGroup
from workers.rft.models import build_tiny_model, load_policy, load_tokenizer
from workers.rft.synchronizer import Synchronizer
from workers.rft.weight_manifest import model_fingerprint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: two GPUs"),
]
PROMPTS = ["What is 7 + 5?", "The quick brown fox", "12+30=42\n4*5=", "Hello! How can I help"]
GREEDY = SamplingParams(n=1, temperature=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def greedy(engine, tokenizer):
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]
    return [c.token_ids for group in engine.generate(prompts, GREEDY) for c in group]


def wait_until(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def perturb(model, seed: int):
    generator = torch.Generator(device=model.device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device=p.device) * p.std() * 0.3)


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_an_nccl_sync_gives_the_explorer_the_trainers_answers(tiny_path, engine):
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    tokenizer = load_tokenizer(tiny_path)
    trainer = load_policy(tiny_path, torch.device("cuda:0"))
    if engine == "vllm":
        from workers.rft.engines.vllm_engine import VLLMEngine

        explorer = VLLMEngine(str(tiny_path), tokenizer, dtype=torch.float32, device=torch.device("cuda:1"),
                              generation_config=trainer)
    else:
        explorer = TransformersEngine(load_policy(tiny_path, torch.device("cuda:1")), tokenizer)
    rendezvous = InMemoryWeightGroup(explorers=1)
    sender = Synchronizer("nccl", group=rendezvous.side(0), timeout_s=60, device="cuda:0")
    receiver = Synchronizer("nccl", group=rendezvous.side(1), timeout_s=60, device="cuda:1")
    reference = TransformersEngine(trainer, tokenizer)
    try:
        wait_until(sender.ready)
        sender.check()
        assert greedy(explorer, tokenizer) == greedy(reference, tokenizer)  # both the starting model
        for version in (0, 1, 2):
            if version:
                perturb(trainer, version)
            sender.publish(trainer, version)
            wait_until(lambda v=version: receiver.latest_version() == v)
            receiver.pull(explorer, version)
            assert explorer.model_version == version
            assert greedy(explorer, tokenizer) == greedy(reference, tokenizer), f"version {version}"
            if engine == "transformers":
                assert model_fingerprint(explorer.model) == model_fingerprint(trainer)
        sender.check()
    finally:
        sender.close()
        receiver.close()
        if hasattr(explorer, "close"):
            explorer.close()
