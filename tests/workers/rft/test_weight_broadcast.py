"""The broadcast weight sync (workers/rft/weight_broadcast.py): a trainer process sends versions
over a gloo group to explorer processes, which then hold the trainer's weights bit for bit.

The process functions live at module level: spawned interpreters import them from here by name.
"""
import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from workers.rft.distributed import free_port
from workers.rft.engines import SamplingParams, TransformersEngine
from workers.rft.models import load_policy, load_tokenizer
from workers.rft.weight_broadcast import ModelReceiver, Receiver, Sender
from workers.rft.weight_manifest import (
    Manifest,
    TensorMeta,
    WeightSyncError,
    checksum,
    fingerprint,
    model_fingerprint,
    unique_tensors,
)

CPU = torch.device("cpu")
HOST = "127.0.0.1"
SECRET = "the group's secret, as a run's would be"  # every side proves it knows it (distributed.handshake)
PROMPTS = ["What is 7 + 5?", "The quick brown fox", "12+30=42\n4*5=", "Hello! How can I help"]
GREEDY = SamplingParams(n=1, temperature=0, max_new_tokens=8)


def perturb(model, seed, scale=0.3):
    """Move every weight (the tied embedding/head too) far enough to change greedy outputs;
    deterministic, so any process can make version `seed` of the model."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std() * scale)
    return model


def greedy(model, tokenizer):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in PROMPTS]
    return [c.token_ids for group in TransformersEngine(model, tokenizer).generate(prompts, GREEDY) for c in group]


def _process(index: int, roles: list, out: str) -> None:
    """Process `index` of a test: runs roles[index] = (function, args) and saves what it returns."""
    torch.set_num_threads(1)  # three processes on a shared 2-core machine
    fn, args = roles[index]
    torch.save(fn(*args), Path(out) / f"{index}.pt")


def run(roles: list, tmp_path: Path) -> list:
    """Run each (function, args) in a process of its own; their results, in order (None for one
    that exited without a result)."""
    mp.start_processes(_process, args=(roles, str(tmp_path)), nprocs=len(roles), join=True, start_method="spawn")
    return [torch.load(p, weights_only=False) if (p := tmp_path / f"{i}.pt").exists() else None
            for i in range(len(roles))]


# -- processes ----------------------------------------------------------------------------------------


def trainer(path, port, explorers, versions, timeout_s=60.0):
    tokenizer = load_tokenizer(path)
    model = load_policy(path, CPU)
    sender = Sender(HOST, port, explorers, timeout_s=timeout_s, secret=SECRET)
    results = {"digests": {}, "greedy": {}, "errors": {}}
    try:
        for version in versions:
            perturb(model, version)
            started = time.monotonic()
            try:
                results["digests"][version] = sender.send(model.state_dict(), version)
            except WeightSyncError as err:
                results["errors"][version] = (str(err), time.monotonic() - started)
                break
            results["greedy"][version] = greedy(model, tokenizer)
            results["trainer_digest", version] = model_fingerprint(model)
        results["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        sender.close()
    return results


def explorer(path, port, rank, world_size, versions, how="ok", timeout_s=60.0):
    tokenizer = load_tokenizer(path)
    engine = TransformersEngine(load_policy(path, CPU), tokenizer)
    receiver = ModelReceiver(engine, HOST, port, rank, world_size, timeout_s=timeout_s, name=f"explorer-{rank}",
                             secret=SECRET)
    results = {"greedy": {}, "digest": {}}
    for i, version in enumerate(versions):
        if how != "ok" and i == 1:  # the second version never arrives here
            if how == "hang":
                time.sleep(timeout_s + 5)
            os._exit(0)  # gone without a word
        try:
            assert receiver.receive_into() == version == engine.model_version
        except WeightSyncError as err:  # the trainer's send failed under it
            results["error"] = str(err)
            break
        results["greedy"][version] = greedy(engine.model, tokenizer)
        results["digest"][version] = model_fingerprint(engine.model)
    results["state"] = {k: v.clone() for k, v in engine.model.state_dict().items()}
    receiver.close()
    return results


# -- tests ---------------------------------------------------------------------------------------------


def test_checksums_are_exact_and_see_one_bit():
    a = torch.randn(1000)
    b = a.clone()
    b.view(torch.int32)[123] ^= 1  # the last mantissa bit of one value
    assert checksum(a) == checksum(a.clone()) != checksum(b)
    half = a.to(torch.bfloat16)  # 2-byte floats are summed as int16
    flipped = half.clone()
    flipped.view(torch.int16)[5] ^= 1
    assert checksum(half) != checksum(flipped)


def test_a_corrupted_transfer_is_refused(tiny_model):
    tensors = unique_tensors(tiny_model.state_dict())
    flat = torch.cat([t.reshape(-1) for _, t in tensors])
    metas, offset = [], 0
    for name, t in tensors:
        metas.append(TensorMeta(name, tuple(t.shape), "float32", offset))
        offset += t.numel()
    manifest = Manifest(1, 1, metas, {"float32": offset})
    manifest.checksums = fingerprint(manifest.views({"float32": flat}))
    assert Receiver.verify(None, manifest, {"float32": flat}) == model_fingerprint(tiny_model)
    flat.view(torch.int32)[offset // 2] ^= 1
    with pytest.raises(WeightSyncError, match="1 tensors arrived corrupted"):
        Receiver.verify(None, manifest, {"float32": flat})


def test_a_tied_head_is_sent_once(tiny_model):
    names = [name for name, _ in unique_tensors(tiny_model.state_dict())]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert fingerprint(tiny_model.state_dict()).keys() == set(names)


def test_lora_is_sent_merged_under_the_plain_models_names(tiny_path):
    from types import SimpleNamespace

    from workers.rft.models import add_lora, merged_state_dict

    base = load_policy(tiny_path, CPU)
    plain = sorted(name for name, _ in unique_tensors(base.state_dict()))
    lora = SimpleNamespace(r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = add_lora(load_policy(tiny_path, CPU), lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter: the merged weights differ from the base
    merged = merged_state_dict(model)
    assert sorted(name for name, _ in unique_tensors(merged)) == plain  # the head tied, sent once
    assert model_fingerprint(model) != model_fingerprint(base)


@pytest.mark.slow
def test_two_explorers_hold_the_trainers_weights_bit_for_bit(tiny_path, tmp_path):
    port, versions = free_port(), [1, 2]
    roles = [(trainer, (tiny_path, port, 2, versions))]
    roles += [(explorer, (tiny_path, port, rank, 3, versions)) for rank in (1, 2)]
    sent, *explorers = run(roles, tmp_path)
    assert not sent["errors"]
    for version in versions:
        want = sent["trainer_digest", version]
        # Every explorer acknowledged the trainer's weights (the sender checks each digest).
        assert sent["digests"][version] == {1: want, 2: want}
        for got in explorers:
            assert got["digest"][version] == want
            assert got["greedy"][version] == sent["greedy"][version]
    assert sent["greedy"][1] != sent["greedy"][2]  # the versions differ where it shows
    for got in explorers:
        assert got["state"].keys() == sent["state"].keys()
        for name, tensor in sent["state"].items():
            assert torch.equal(got["state"][name], tensor), name
        # Tied: the head is the embedding after the sync too (it came under the embedding's name).
        assert torch.equal(got["state"]["lm_head.weight"], got["state"]["model.embed_tokens.weight"])


@pytest.mark.slow  # three processes that each import torch and transformers: ~25 s on 2 cores
@pytest.mark.parametrize("how", ["exit", "hang"])
def test_an_explorer_gone_fails_the_send_naming_it(tiny_path, tmp_path, how):
    port, versions, timeout_s = free_port(), [1, 2], 5.0
    roles = [(trainer, (tiny_path, port, 2, versions, timeout_s)),
             (explorer, (tiny_path, port, 1, 3, versions, "ok", timeout_s)),
             (explorer, (tiny_path, port, 2, 3, versions, how, timeout_s))]
    sent, first, gone = run(roles, tmp_path)
    assert gone is None  # it left no result
    message, seconds = sent["errors"][2]
    assert "explorer-2" in message and "explorer-1" not in message, message
    assert f"no answer within {timeout_s:g} s" in message, message
    # The broadcast's failure (at once when explorer-2 is dead, one timeout when it hangs), then
    # one timeout and a grace for the live explorer's answer.
    assert seconds < 4 * timeout_s
    assert 1 in sent["digests"] and 2 not in sent["digests"]
    assert 1 in first["digest"]


# -- vLLM ------------------------------------------------------------------------------------------------


def vllm_trainer(path, port, versions, timeout_s=300.0):
    """The trainer of the vLLM test: sends each version when the explorer asks (a store key)."""
    model = load_policy(path, CPU)
    sender = Sender(HOST, port, 1, timeout_s=timeout_s, secret=SECRET)
    digests = {}
    try:
        for version in versions:
            perturb(model, version)
            digests[version] = (sender.send(model.state_dict(), version), model_fingerprint(model),
                                dict(sender.last_seconds))
    finally:
        sender.close()
    return digests


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_takes_broadcast_weights(tiny_path, tokenizer, tmp_path, data_dir):
    """trainer -> vLLM over gloo through vLLM's weight-transfer API (our rft_gloo backend): greedy
    tokens equal transformers' before and after each sync (tiny model: tied embeddings)."""
    import vllm

    from workers.rft import weight_broadcast_vllm as wb
    from workers.rft.engines import vllm_engine

    from .test_vllm import assert_same_greedy

    real_llm = vllm.LLM

    def llm_with_broadcast(**options):  # what engines/vllm_engine.py would pass itself
        return real_llm(**(options | wb.engine_options()))

    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in PROMPTS]
    hf = TransformersEngine(load_policy(tiny_path, CPU), tokenizer)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm, "LLM", llm_with_broadcast)
        engine = vllm_engine.VLLMEngine(tiny_path, tokenizer, dtype=torch.float32, device=CPU)
    try:
        assert_same_greedy(engine.generate(prompts, GREEDY), hf, prompts, GREEDY.max_new_tokens)
        port, versions = free_port(), [1, 2]
        context = mp.get_context("spawn")
        process = context.Process(target=_process, args=(0, [(vllm_trainer, (tiny_path, port, versions))],
                                                         str(tmp_path)))
        process.start()
        wb.join(engine._llm, HOST, port, 1, 2, SECRET, timeout_s=300, name="vllm-explorer")
        for version in versions:
            started = time.perf_counter()
            report = wb.receive(engine._llm)
            assert report["version"] == version
            engine.model_version = version
            print(f"vLLM took version {version} in {time.perf_counter() - started:.3f} s; "
                  f"checked bit for bit: {report['verified']}")
            # What vLLM keeps as sent on CPU (the rest is fused and repacked) is checked exactly.
            assert {"model.embed_tokens.weight", "model.norm.weight"} <= set(report["verified"])
            perturb(hf.model, version)  # the trainer's weights, made the same way here
            assert_same_greedy(engine.generate(prompts, GREEDY), hf, prompts, GREEDY.max_new_tokens)
        process.join(120)
        assert process.exitcode == 0
        digests = torch.load(tmp_path / "0.pt", weights_only=False)
        for version in versions:
            acked, trainer_digest, _ = digests[version]
            assert acked == {1: trainer_digest}  # vLLM received exactly the trainer's bytes
        assert trainer_digest == model_fingerprint(hf.model)
    finally:
        engine.close()
