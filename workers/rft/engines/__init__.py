from .base import Completion, RolloutEngine, SamplingParams
from .transformers_engine import TransformersEngine

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "TransformersEngine", "build_engine"]


def build_engine(name: str, model, tokenizer) -> RolloutEngine:
    """`explorer.engine`: auto picks vLLM when it is installed and usable (not yet), else transformers."""
    if name in ("auto", "transformers"):
        return TransformersEngine(model, tokenizer)
    raise NotImplementedError(f"rollout engine {name!r} is not available yet; use 'transformers'")
