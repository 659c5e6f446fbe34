"""Chunked token log-probs (logprobs.py) against the whole [B, T, V] logits they replace: the same
values, entropies and gradients, in fp64 so that only a real difference shows."""
import pytest
import torch

from workers.rft.algorithms import entropy_from_logits
from workers.rft.logprobs import chunked_logprobs, response_hidden, response_logits, token_logprobs
from workers.rft.micro_batches import collate
from workers.rft.models import load_policy

from .test_trainer import experience, make_trainer, rollouts

CPU = torch.device("cpu")


def fp64(model):
    # SDPA: gqa_eager's softmax runs in fp32, where fp64's most negative value becomes -inf and a
    # fully masked padding row NaN.
    model.double().set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("shared", [True, False])
def test_chunks_give_the_values_and_gradients_of_whole_logits(tiny_path, tokenizer, shared):
    batch = rollouts(tokenizer, n=6) + [experience(tokenizer, 12, 34, answer=7)]
    mb = collate(batch, tokenizer.pad_token_id, CPU)
    if not shared:
        mb.prompt_rows = mb.row_prompt = None
    model = fp64(load_policy(tiny_path, CPU))
    params = list(model.parameters())
    vocab = model.config.vocab_size

    def whole():
        logits = response_logits(model, mb) / 0.7
        return token_logprobs(logits, mb.response_ids), entropy_from_logits(logits)

    def chunked():
        hidden, head = response_hidden(model, mb)
        # 5 positions a chunk: the 7 x T positions split unevenly, the last chunk short.
        return chunked_logprobs(hidden, head, mb.response_ids, 0.7, entropy=True, chunk=5 * vocab)

    results = []
    for compute in (whole, chunked):
        logprobs, entropy = compute()
        objective = (logprobs * mb.mask).sum() + 0.1 * (entropy * mb.mask).sum()
        results.append((logprobs.detach(), entropy.detach(), torch.autograd.grad(objective, params)))
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    real = mb.mask.bool()
    torch.testing.assert_close(lp_b[real], lp_a[real], atol=1e-10, rtol=0)
    torch.testing.assert_close(ent_b[real], ent_a[real], atol=1e-6, rtol=0)  # losses.py takes it in fp32
    for (name, _), a, b in zip(model.named_parameters(), grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=1e-8, rtol=1e-6, msg=name)


def test_without_gradients_no_chunk_is_kept_for_a_backward(tiny_path, tokenizer):
    mb = collate(rollouts(tokenizer, n=4), tokenizer.pad_token_id, CPU)
    model = load_policy(tiny_path, CPU)
    with torch.no_grad():
        hidden, head = response_hidden(model, mb)
        logprobs, entropy = chunked_logprobs(hidden, head, mb.response_ids)
    assert entropy is None and logprobs.grad_fn is None and logprobs.shape == mb.response_ids.shape


@pytest.mark.parametrize("loss", ["grpo", "sft", "grpo with an entropy bonus"])
def test_a_chunked_trainer_step_equals_the_whole_logits_step(tiny_path, tokenizer, loss):
    """Loss, entropy, gradient norm and every gradient of one step, to 1e-6 (fp64). The entropy
    bonus reads the per-token entropies chunked_logprobs computes (LossInputs.entropy), with
    their gradient: it never needs the whole logits either."""
    if loss.startswith("grpo"):
        batch, sections = rollouts(tokenizer), {}
        if loss.endswith("bonus"):
            sections = {"algorithm": {"entropy_coef": 0.1}}
    else:
        batch = [experience(tokenizer, i, 2 * i, source="expert") for i in range(6)]
        sections = {"algorithm": {"name": "sft"}}
    steps = []
    for chunked in (False, True):
        trainer = make_trainer(tiny_path, tokenizer, batch, trainer={"micro_batch_size": 4, "batch_size": 8},
                               **sections)
        fp64(trainer.policy)
        assert trainer.chunked  # the default with no entropy bonus, on one process
        trainer.chunked = chunked
        steps.append((trainer.train_step(), [p.grad for p in trainer.policy.parameters()]))
    (whole, grads_whole), (chunk, grads_chunk) = steps
    for key in ("loss", "entropy", "grad_norm"):
        assert chunk[key] == pytest.approx(whole[key], abs=1e-6, rel=1e-6), key
    for a, b in zip(grads_whole, grads_chunk):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)


