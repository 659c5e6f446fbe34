"""The CPU attention (workers/rft/attention.py) computes what transformers' SDPA computes."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.rft import attention
from workers.rft.models import load_policy

CPU = torch.device("cpu")


@pytest.fixture
def models(tiny_path):
    ours = load_policy(tiny_path, CPU)
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa")
    assert ours.config._attn_implementation == attention.NAME
    return ours, sdpa


def left_padded_batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 500, (6, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[:2, :9] = 0  # two rows left-padded, as the engine and trainer batch them
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_logits_and_gradients_match_sdpa(models):
    ours, sdpa = models
    ids, mask, positions = left_padded_batch()
    real = mask.bool()
    a = ours(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    b = sdpa(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert torch.allclose(a[real], b[real], atol=1e-5)
    a[real].logsumexp(-1).sum().backward()
    b[real].logsumexp(-1).sum().backward()
    for (name, p), q in zip(ours.named_parameters(), sdpa.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name
    # no mask at all: causal
    assert torch.allclose(ours(input_ids=ids).logits, sdpa(input_ids=ids).logits, atol=1e-5)


@torch.no_grad()
def test_decoding_with_a_cache_matches_sdpa(models):
    ours, sdpa = models
    ids, mask, positions = left_padded_batch()
    outs = []
    for model in models:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        step_mask = torch.cat([mask, torch.ones(len(ids), 1, dtype=mask.dtype)], 1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        nxt = model(input_ids=token, attention_mask=step_mask, position_ids=positions[:, -1:] + 1,
                    past_key_values=out.past_key_values, use_cache=True)
        outs.append(nxt.logits[:, -1])
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


@torch.no_grad()
def test_large_score_matrices_go_to_sdpa(models, monkeypatch):
    ours, sdpa = models
    ids, mask, positions = left_padded_batch()
    monkeypatch.setattr(attention, "MAX_SCORES", 0)
    a = ours(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    b = sdpa(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert torch.equal(a[mask.bool()], b[mask.bool()])
