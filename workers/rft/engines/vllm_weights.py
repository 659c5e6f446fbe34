"""vLLM's weights, checked: what the engine (vllm_engine.py) runs inside vLLM's worker to load a
version in place (`RFTWorkerExtension`, passed to vLLM as `worker_extension_cls`), and the guard
that checks, from the engine's process, that the worker holds the version it was given.

Two traps are handled after every reload:
- on CPU, linear layers run on prepacked copies of their weights made when a layer is processed.
  A tied output head (`tie_word_embeddings`) receives no weights of its own, so the reload never
  re-processes it and it silently keeps computing with the *first* version's embedding. Every
  module whose weight is shared with another one is re-processed after a reload;
- cached prefixes (KV blocks) computed with the old weights are dropped (`reset_prefix_cache`,
  by the engine).
Then a guard checks, inside the worker, that the weights really are the new ones: every
parameter vLLM keeps as loaded (found at start-up by comparing with the model's files; on CPU the
embedding and the norms: linear layers are packed away) must have the published values (float64
sum and absolute sum), and every tied head must compute with its current weight (probed with
one-hot inputs, exact). That packed linear layers take new weights is shown by the tests
(tests/workers/rft/test_vllm.py: greedy tokens equal to transformers' after every sync). A mismatch
raises `StaleWeightsError`, and the engine refuses to generate until a sync succeeds: it never
serves stale weights silently.
"""
from __future__ import annotations

import base64
import pickle
from pathlib import Path

import torch

WORKER_EXTENSION = f"{__name__}.RFTWorkerExtension"
# Relative tolerance of the weight fingerprints: both sides sum the very same float values in
# float64, so only summation order differs.
FINGERPRINT_RTOL = 1e-9
# A tied head fed one-hot inputs returns columns of its weight: exact, up to the kernel's rounding.
TIED_RTOL = 1e-5


class StaleWeightsError(RuntimeError):
    """vLLM does not hold the weights it was just given."""


# ---------------------------------------------------------------------------------------------
# Weight fingerprints (main process side)


def _fingerprint(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    values = tensor.detach().to(dtype).double()
    return values.sum().item(), values.abs().sum().item()


def fingerprint_tensors(items, dtype: torch.dtype) -> dict[str, tuple[float, float]]:
    return {name: _fingerprint(tensor, dtype) for name, tensor in items}


def fingerprint_files(path: Path, dtype: torch.dtype, names=None) -> dict[str, tuple[float, float]]:
    """Fingerprints of the tensors of a saved HF directory (only `names`, when given)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    expected = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if names is None or name in names:
                    expected[name] = _fingerprint(handle.get_tensor(name), dtype)
    return expected


def mismatches(expected: dict, actual: dict, names: set[str]) -> dict[str, str]:
    """The names among `names` whose fingerprints differ (or are missing) on the two sides."""
    problems = {}
    for name in sorted(names):
        if name not in expected or name not in actual:
            problems[name] = f"{name} is missing ({'published weights' if name not in expected else 'vLLM'})"
            continue
        (want_sum, want_abs), (got_sum, got_abs) = expected[name], actual[name]
        tolerance = FINGERPRINT_RTOL * max(want_abs, 1e-30)
        if abs(want_sum - got_sum) > tolerance or abs(want_abs - got_abs) > tolerance:
            problems[name] = f"{name} differs (sum {got_sum:.9g}, expected {want_sum:.9g})"
    return problems


def ipc_handles(weights: dict) -> tuple[str, list]:
    """CUDA IPC handles of the tensors, keyed by the GPU's UUID, pickled for the RPC."""
    from torch.multiprocessing.reductions import reduce_tensor

    keep_alive, handles = [], []
    for name, tensor in weights.items():
        tensor = tensor.contiguous()
        keep_alive.append(tensor)
        uuid_ = str(torch.cuda.get_device_properties(tensor.device).uuid)
        handles.append((name, {uuid_: reduce_tensor(tensor)[1]}))
    return base64.b64encode(pickle.dumps(handles)).decode(), keep_alive


# ---------------------------------------------------------------------------------------------
# Inside vLLM's worker process


class RFTWorkerExtension:
    """Methods vLLM adds to its worker (`worker_extension_cls`), called with `collective_rpc`."""

    def rft_reload_weights(
        self, weights_path: str | None = None, ipc_handles: str | None = None, refresh_tied: bool = True
    ) -> dict:
        """Load new weights in place, re-process tied modules, report what the model now holds.
        (`refresh_tied=False` skips the fix of the tied-head trap: tests show the guard catches it.)"""
        if ipc_handles is not None:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            device_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            physical = str(torch.cuda.get_device_properties(device_index).uuid)
            weights = []
            for name, by_gpu in pickle.loads(base64.b64decode(ipc_handles)):
                args = list(by_gpu[physical])
                args[6] = device_index  # the receiver's index of the same GPU
                weights.append((name, rebuild_cuda_tensor(*args)))
            self.reload_weights(weights_iterator=weights)
            del weights
        else:
            self.reload_weights(weights_path=weights_path)
        model = self.model_runner.get_model()
        tied_errors = refresh_tied_modules(model) if refresh_tied else _check_tied_modules(model)
        return {"fingerprint": self.rft_fingerprint(), "tied_errors": tied_errors}

    def rft_fingerprint(self) -> dict[str, tuple[float, float]]:
        """Sums of every parameter the model still holds as plain values (not prepacked away)."""
        model = self.model_runner.get_model()
        return {
            name: (p.detach().double().sum().item(), p.detach().double().abs().sum().item())
            for name, p in model.named_parameters()
            if p.numel() > 0 and not p.is_meta
        }

    def rft_tied_errors(self) -> dict[str, tuple[float, float]]:
        """The tied-head check alone (for tests), without refreshing."""
        return _check_tied_modules(self.model_runner.get_model())


def _tied_groups(model) -> list[list]:
    """Modules that share one weight Parameter (an output head tied to the embedding)."""
    by_weight = {}
    for name, module in model.named_modules(remove_duplicate=False):
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and hasattr(module, "quant_method"):
            by_weight.setdefault(id(weight), {})[name] = module
    return [list(group.items()) for group in by_weight.values() if len({id(m) for m in group.values()}) > 1]


def refresh_tied_modules(model) -> dict[str, tuple[float, float]]:
    """Process tied modules again so their kernels (CPU: prepacked copies) see the new weight;
    return the check of each afterwards."""
    for group in _tied_groups(model):
        for _, module in group:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
    return _check_tied_modules(model)


def stale_tied(errors: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Of a tied-module check's (max |Δ|, max |weight|) per module, those off by more than TIED_RTOL."""
    return {name: (diff, scale) for name, (diff, scale) in errors.items() if diff > TIED_RTOL * scale}


@torch.no_grad()
def _check_tied_modules(model) -> dict[str, tuple[float, float]]:
    """For each tied module that computes logits (an output head), feed one-hot inputs: the
    output must be the matching columns of its weight. Returns (max |Δ|, max |weight|) per module."""
    errors = {}
    for group in _tied_groups(model):
        for name, module in group:
            method = getattr(module, "quant_method", None)
            if method is None or not hasattr(method, "apply") or not name.endswith("lm_head"):
                continue
            weight = module.weight
            hidden = weight.shape[1]
            columns = torch.linspace(0, hidden - 1, steps=min(8, hidden)).long().to(weight.device)
            probe = torch.zeros(len(columns), hidden, dtype=weight.dtype, device=weight.device)
            probe[torch.arange(len(columns)), columns] = 1
            got = method.apply(module, probe)[:, : weight.shape[0]].float()
            want = weight[:, columns].t().float()
            errors[name] = ((got - want).abs().max().item(), want.abs().max().item())
    return errors

