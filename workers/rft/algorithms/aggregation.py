"""Reduce a per-token loss matrix [B, T] to a scalar over the tokens the mask keeps (verl's agg_loss)."""
import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the kept entries; 0 when nothing is kept (mask sums are whole numbers, so clamp(1) is exact)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, scale: float | None = None) -> torch.Tensor:
    """token-mean: every kept token weighs the same (long responses weigh more);
    seq-mean-token-mean: every sequence weighs the same, tokens averaged within it;
    seq-mean-token-sum: every sequence weighs the same, tokens summed within it;
    seq-mean-token-sum-norm: tokens summed within a sequence and divided by a constant `scale`
    (algorithm.loss_scale_factor: Dr. GRPO's generation budget), then averaged over sequences.
    (verl's agg_loss returns that mode's sum over the micro-batch's sequences; averaging keeps the
    value independent of micro_batch_size, as every other mode here.)
    The seq-mean modes average over sequences that keep at least one token, so an empty row does
    not dilute the others."""
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode '{mode}'; known: {', '.join(AGG_MODES)}")
    seq_sum = (loss_mat * mask).sum(dim=-1)
    seq_len = mask.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / seq_len.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        if not scale:
            raise ValueError("loss_agg_mode 'seq-mean-token-sum-norm' needs its scale (algorithm.loss_scale_factor)")
        per_seq = seq_sum / scale
    else:
        per_seq = seq_sum
    return masked_mean(per_seq, (seq_len > 0).to(per_seq.dtype))
