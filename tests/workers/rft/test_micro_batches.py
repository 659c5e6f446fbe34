"""Micro-batches sized by tokens (trainer.micro_batch_tokens, issue #43): answers of varied length
go many to a micro-batch when short and few when long, and the step is the one by rows."""
import pytest
import torch

from workers.rft.experience import Experience, PreferencePair
from workers.rft.micro_batches import chunks, collate, pack, pack_pairs
from workers.rft.models import load_tokenizer

from .test_distributed import TIMED, lone, train
from .test_fsdp import LR
from .test_trainer import rollouts


def row(prompt: int, response: int) -> Experience:
    return Experience(task_id=None, group_id="g", rollout_index=0, prompt_ids=[1] * prompt,
                      response_ids=[2] * response, action_mask=[1] * response)


def padded_tokens(rows: list[Experience]) -> int:
    return collate(rows, 0, torch.device("cpu")).input_ids.numel()  # as the trainer pads them


def test_rows_go_together_up_to_the_token_budget_in_their_order():
    rows = [row(10, 6)] * 6 + [row(10, 1000), row(12, 40), row(10, 2000)] + [row(10, 6)] * 3
    packed = pack(rows, most_rows=8, most_tokens=1024)
    assert [len(mb) for mb in packed] == [6, 1, 1, 1, 3]  # 8 short rows would be 128 tokens; 6 then end the run
    assert [r for mb in packed for r in mb] == rows  # every row once, in order (a group stays together)
    for mb in packed:
        assert len(mb) == 1 or padded_tokens(mb) <= 1024  # a row past the budget alone
    assert [len(mb) for mb in pack([row(10, 6)] * 20, most_rows=8, most_tokens=1024)] == [8, 8, 4]
    assert pack(rows, 4) == chunks(rows, 4)  # without a budget: by rows, as before
    # Padding counts: a short answer after a long one is padded to the long one's width.
    assert [len(mb) for mb in pack([row(10, 90), row(10, 6), row(10, 6)], most_rows=8, most_tokens=200)] == [2, 1]


def pair(prompt: int, chosen: int, rejected: int) -> PreferencePair:
    return PreferencePair([1] * prompt, [2] * chosen, [3] * rejected)


def test_dpo_pairs_go_together_up_to_the_token_budget():
    """trainer.micro_batch_tokens was ignored for pairs: four pairs of 300 tokens made one micro-batch
    of 2,400 padded tokens under a budget of 600."""
    pairs = [pair(100, 200, 150)] * 4
    packed = pack_pairs(pairs, most_rows=8, most_tokens=600)
    assert [len(mb) for mb in packed] == [2, 2, 2, 2] and all(padded_tokens(mb) <= 600 for mb in packed)
    chosen, rejected = packed[0]
    assert chosen.response_ids == [2] * 200 and rejected.response_ids == [3] * 150  # chosen rows, then rejected
    by_rows = pack_pairs(pairs, most_rows=8)
    assert [len(mb) for mb in by_rows] == [8]  # without a budget: 4 pairs of 8 rows, as before
    assert [[r.response_ids[0] for r in mb] for mb in by_rows] == [[2, 2, 2, 2, 3, 3, 3, 3]]
    assert [len(mb) for mb in pack_pairs(pairs, most_rows=3)] == [2] * 4  # 3 rows: one pair
    small = [pair(10, 5, 5)] * 5 + [pair(10, 500, 5)]
    assert [len(mb) for mb in pack_pairs(small, most_rows=8, most_tokens=200)] == [8, 2, 2]  # the long one alone


@pytest.mark.parametrize("case", ["grpo", "mix"])
def test_a_step_by_tokens_is_the_step_by_rows(case, tiny_path):
    """The grpo case's 8 rows by 3 (3 + 3 + 2) against a budget that fits 2 of them a micro-batch;
    mix adds its expert part."""
    batch = rollouts(load_tokenizer(tiny_path), 8)
    assert [len(mb) for mb in pack(batch, 8, 32)] == [2, 2, 2, 2] != [len(mb) for mb in chunks(batch, 3)]
    by_rows = lone(case, tiny_path)
    by_tokens = train(None, case, tiny_path, trainer_keys={"micro_batch_size": 8, "micro_batch_tokens": 32})
    for one, two in zip(by_rows["metrics"], by_tokens["metrics"], strict=True):
        for key in one.keys() - TIMED:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for name, value in by_rows["policy"].items():
        torch.testing.assert_close(by_tokens["policy"][name], value, rtol=1e-5, atol=2e-1 * LR,
                                   msg=lambda m, name=name: f"{name}: {m}")
