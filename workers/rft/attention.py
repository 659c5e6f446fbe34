"""Attention for small models on CPU: grouped-query attention as two batched matmuls.

torch's CPU SDPA kernel expands the key/value heads to the query heads (repeat_kv) and works
through (batch, head) blocks one at a time; for the short sequences and few heads of RFT on
small models, plain matmuls over the heads that share a key/value head are faster (the queries of
one group multiply the same K and V, so they are stacked instead of copying K and V). Past
MAX_SCORES score elements the [B, H, Tq, Tk] matrix would cost more memory than it saves time,
and SDPA takes over. Registered with transformers as "gqa_eager" (boolean masks, as SDPA's).
"""
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "gqa_eager"
MAX_SCORES = 4 * 1024 * 1024  # elements of the score matrix (16 MB in fp32)


def gqa_eager_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query [B, Hq, Tq, D], key/value [B, Hkv, Tk, D], attention_mask bool [B, 1, Tq, Tk] (True:
    attend) or None (causal, no padding) -> ([B, Tq, Hq, D], None), as transformers expects."""
    batch, heads, tq, dim = query.shape
    kv_heads, tk = key.shape[1], key.shape[2]
    if batch * heads * tq * tk > MAX_SCORES or dropout > 0:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    group = heads // kv_heads
    scaling = dim**-0.5 if scaling is None else scaling
    # Heads h = kv * group + r share key/value head kv (transformers' repeat_kv order).
    q = query.reshape(batch, kv_heads, group * tq, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).mul_(scaling).view(batch, heads, tq, tk)
    if attention_mask is None and tq > 1:
        attention_mask = torch.ones(tq, tk, dtype=torch.bool, device=query.device).tril(tk - tq)
    if attention_mask is not None:
        # The most negative finite value, not -inf: a fully masked (padding) row stays finite.
        scores = scores.masked_fill(~attention_mask[..., :tk], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.view(batch, kv_heads, group * tq, tk), value)
    return out.view(batch, heads, tq, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, gqa_eager_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def attention_for(device: torch.device) -> str:
    """The attention implementation to load models with on this device."""
    return NAME if device.type == "cpu" else "sdpa"
