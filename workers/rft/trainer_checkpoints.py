"""The trainer's checkpoints (Trainer's part that writes and reads them): a complete HF model
directory plus what resuming exactly needs (optimizer state, step, RNG states, the loop's
counters), written whole or not at all, and read back with weights_only so a changed file cannot
run code (#30). Apart from trainer.py, which is about a step, to keep each one readable in one sitting."""
import json
import os
import pickle
import random
import re
import shutil
import time
import uuid
from pathlib import Path

import torch

from . import distributed
from .models import copy_weights, is_lora, merged_state_dict, read_weights, save_merged


class TrainerCheckpoints:
    """Mixed into Trainer: its policy, critic, optimizers, tokenizer, ranks and step."""

    def full_state(self, checkpoint: bool = False) -> dict:
        """The policy's full weights ('policy', merged with LoRA), as one process holds them: what
        the explorer gets. With `checkpoint` also the critic's ('critic') and the optimizers' state
        ('optimizer', 'critic_optimizer'). Under fsdp they are sharded over the ranks: the leader
        has every rank take part (command 'gather') and alone gets them; a follower gets {}."""
        if self.sharded and self.ranks.is_leader:
            self.ranks.send("gather", checkpoint)
        state = {}
        for name, model, optimizer in (("policy", self.policy, self.optimizer),
                                       ("critic", self.critic, self.critic_optimizer)):
            if model is None or (name == "critic" and not checkpoint):
                continue
            optimizer_key = "optimizer" if name == "policy" else f"{name}_optimizer"
            if self.sharded:
                state[name] = distributed.full_weights(model)
                if checkpoint:
                    state[optimizer_key] = distributed.full_optimizer_state(model, optimizer)
            else:
                state[name] = merged_state_dict(model)
                if checkpoint:
                    state[optimizer_key] = optimizer.state_dict()
        return state if not self.sharded or self.ranks.is_leader else {}

    def save_checkpoint(self, path: str | Path, extra: dict | None = None) -> Path:
        """A complete HF model directory (weights + tokenizer) plus what resuming needs: optimizer
        state, step, RNG states and `extra` (the loop's own counters). Written to a temporary
        directory and renamed, so a crash never leaves half a checkpoint. With LoRA the weights are
        the merged ones (the directory stays a plain model) and adapter/ holds the adapters
        (peft's format), which resuming loads onto the unchanged base."""
        path = Path(path)
        started = time.perf_counter()
        state = self.full_state(checkpoint=True)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
        try:
            save_merged(self.policy, tmp, state["policy"])
            if is_lora(self.policy):
                self.policy.save_pretrained(tmp / "adapter")
            self.tokenizer.save_pretrained(tmp)
            torch.save(state["optimizer"], tmp / "optimizer.pt")
            if self.critic is not None:
                self.critic.save_pretrained(tmp / "critic", state_dict=state["critic"])
                torch.save(state["critic_optimizer"], tmp / "critic_optimizer.pt")
            # Tensors and plain tuples/ints only: load_checkpoint reads it with weights_only.
            rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state_all()
            torch.save(rng, tmp / "rng.pt")
            (tmp / "trainer_state.json").write_text(json.dumps({"step": self.step, "extra": extra or {}}, indent=1))
        except BaseException:  # e.g. a full disk: leave no partial directory behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if path.exists():
            shutil.rmtree(path)
        os.rename(tmp, path)
        self._checkpoint_seconds += time.perf_counter() - started
        return path

    def load_checkpoint(self, path: str | Path) -> dict:
        """Restore everything save_checkpoint wrote; returns its `extra`. The leader has its
        followers load it too (a checkpoint holds the full weights and optimizer state, which each
        rank takes whole under ddp and its shard of under fsdp, so a checkpoint saved by any number
        of ranks resumes on any number, with either strategy)."""
        if self.ranks is not None and self.ranks.is_leader:
            self.ranks.send("load", str(path))
        path = Path(path)
        if is_lora(self.policy):
            load_adapter(self.policy, path / "adapter")
        else:
            self._load_weights(self.policy, read_weights(path))
        optimizer = load_tensors(path / "optimizer.pt", map_location=self.device)
        self._load_optimizer(self.policy, self.optimizer, optimizer)
        if self.critic is not None:
            self._load_weights(self.critic, read_weights(path / "critic"))
            state = load_tensors(path / "critic_optimizer.pt", map_location=self.device)
            self._load_optimizer(self.critic, self.critic_optimizer, state)
        rng = load_tensors(path / "rng.pt")
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        state = json.loads((path / "trainer_state.json").read_text())
        self.step = state["step"]
        return state["extra"]

    def _load_weights(self, model, weights: dict) -> None:
        if self.sharded:
            distributed.load_full_weights(model, weights)
        else:
            copy_weights(model, weights)

    def _load_optimizer(self, model, optimizer, state: dict) -> None:
        if self.sharded:
            distributed.load_full_optimizer_state(model, optimizer, state)
        else:
            optimizer.load_state_dict(state)


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds more than tensors and plain values: it is not loaded."""


def load_tensors(path: Path, **kwargs):
    """torch.load with weights_only: a checkpoint is a file anyone with the data dir may have
    replaced, and a full unpickler runs whatever code it names (#30). A file holding anything else
    is refused in our words: torch's own advises loading it again with weights_only=False or
    allowlisting what it names, and that reached the run's error for every researcher (#41)."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        named = re.search(r"\bGLOBAL ([\w.]{1,100})", str(exc))
        raise UnsafeCheckpoint(
            f"{path.name} of checkpoint {path.parent} was refused as unsafe and not loaded: it holds more than "
            f"tensors and plain values{f' (it names {named[1]})' if named else ''}, and a checkpoint the trainer "
            "writes never does, so the file was changed since. Delete this checkpoint to resume from an earlier one."
        ) from None


def load_adapter(model, path: Path) -> None:
    """The adapters peft saved at `path` into the LoRA policy, in place (the base is as loaded)."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, read_weights(path))
    if result.unexpected_keys:
        raise ValueError(f"adapters do not fit the model: unexpected {sorted(result.unexpected_keys)}")
