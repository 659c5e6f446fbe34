"""What one version of the weights is on the wire of the broadcast synchroniser
(weight_broadcast.py, which sends and receives it): its manifest, JSON (names, shapes, dtypes,
offsets into one flat buffer per dtype, version, one checksum per tensor; never a pickle: a
receiver runs nothing a peer sends), and the checksums that check what arrived.

Checksums. Per tensor, the sum mod 2**64 of its bytes read as int64 words (`checksum`): exact,
independent of summation order (the same on any machine and thread count), and at memory speed
(~30 ms for SmolLM2's 0.5 GB on one core). Not a cryptographic hash: it catches lost, torn or
misplaced transfers, which is what can go wrong here.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

# Integer views of each float dtype, for the checksums (same width, so a view, not a copy).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class WeightSyncError(RuntimeError):
    """A broadcast failed or timed out, or an explorer did not take the weights."""


@dataclass
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32"...
    offset: int  # in elements, into its dtype's buffer

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n


@dataclass
class Manifest:
    seq: int  # the sender's count of sends: acknowledgement keys are per send, not per version
    version: int
    tensors: list[TensorMeta]
    sizes: dict[str, int]  # dtype -> elements in its buffer, in broadcast order
    checksums: dict[str, int] = field(default_factory=dict)  # name -> checksum (empty: not verified)

    def to_json(self) -> bytes:
        tensors = [[m.name, list(m.shape), m.dtype, m.offset] for m in self.tensors]
        return json.dumps({"seq": self.seq, "version": self.version, "tensors": tensors, "sizes": self.sizes,
                           "checksums": self.checksums}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """A manifest as the sender wrote it; WeightSyncError for a dtype torch does not have."""
        fields = json.loads(data)
        dtypes = {m[2] for m in fields["tensors"]} | set(fields["sizes"])
        unknown = sorted(d for d in dtypes if not isinstance(getattr(torch, d, None), torch.dtype))
        if unknown:
            raise WeightSyncError(f"the manifest names dtypes torch does not have: {unknown}")
        tensors = [TensorMeta(name, tuple(shape), dtype, offset) for name, shape, dtype, offset in fields["tensors"]]
        return cls(fields["seq"], fields["version"], tensors, fields["sizes"], fields["checksums"])

    def views(self, buffers: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for each tensor: views into the buffers, no copy."""
        for meta in self.tensors:
            yield meta.name, buffers[meta.dtype][meta.offset : meta.offset + meta.numel].view(meta.shape)


def unique_tensors(state_dict: dict) -> list[tuple[str, torch.Tensor]]:
    """The state dict with each storage once, under its first name: a tied head (lm_head.weight,
    the embedding's tensor) is not sent twice."""
    seen, out = set(), []
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out.append((name, tensor))
    return out


def checksum(tensor: torch.Tensor) -> int:
    """The sum, mod 2**64, of the tensor's bytes read as int64 words (the last < 8 bytes as
    integers of the element's width): exact, independent of summation order, and as fast as a
    float sum (27 ms for 0.5 GB on one core; summing fp32 bits as int32 into int64 took 840 ms:
    that reduction is not vectorised). Tensors start 8-byte aligned, standalone (the allocator)
    and in the flat buffers (`Sender._layout`), so a tensor's words are the same everywhere."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    size = flat.element_size()
    per_word = 8 // size if size <= 8 else 1
    whole = (flat.numel() // per_word) * per_word
    body, tail = flat[:whole], flat[whole:]
    if body.numel() and body.data_ptr() % 8:
        body = body.clone()  # a view at an odd address (never one of our buffers): an aligned copy
    total = int(body.view(torch.int64).sum().item()) if body.numel() else 0
    if tail.numel():
        total += int(tail.view(_BITS[size]).sum(dtype=torch.int64).item())
    return total % 2**64


def fingerprint(weights: dict | Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
    """name -> checksum of each distinct tensor (aliases once, as sent)."""
    items = unique_tensors(weights) if isinstance(weights, dict) else list(weights)
    return {name: checksum(tensor) for name, tensor in items}


def digest(checksums: dict[str, int]) -> str:
    """One short string for a fingerprint: what explorers report and the trainer compares."""
    text = json.dumps(sorted(checksums.items()), separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def model_fingerprint(model) -> str:
    """The digest of a model's weights (a transformers model, or a peft model: merged)."""
    from .models import merged_state_dict

    return digest(fingerprint(merged_state_dict(model)))
