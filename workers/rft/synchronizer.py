"""Weights from the trainer to the explorer, by version.

The trainer publishes version N = trainer_step // interval every `interval` steps; version 0 is
the starting model. Explorer step t needs version max(0, t - offset) // interval: with offset 0
the explorer waits for each new version (synchronous), with offset 1 it runs one version behind
(one-step off-policy), and it never runs more than `offset` steps ahead of what it was promised.

`memory`: a snapshot of the state dict, copied into the explorer's model in this process.
`checkpoint`: a versioned directory <dir>/v{N}/ (HF save_pretrained, safetensors) that any
process can load; the explorer loads exactly the version it needs.
"""
import os
import re
import shutil
import uuid
from pathlib import Path

from .engines import RolloutEngine


class Synchronizer:
    def __init__(self, method: str, interval: int = 1, offset: int = 0, directory: str | Path | None = None, tokenizer=None):
        if method not in ("memory", "checkpoint"):
            raise NotImplementedError(f"synchronizer method {method!r} is not available yet; use memory or checkpoint")
        if method == "checkpoint" and directory is None:
            raise ValueError("the checkpoint synchronizer needs a directory")
        self.method = method
        self.interval = interval
        self.offset = offset
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer  # saved next to the weights, so a version directory is a complete model
        self._snapshot: dict | None = None
        self._snapshot_version = 0

    def required_version(self, explorer_step: int) -> int:
        return max(0, explorer_step - self.offset) // self.interval

    def is_publish_step(self, trainer_step: int) -> bool:
        return trainer_step % self.interval == 0

    def publish(self, model, trainer_step: int) -> int:
        version = trainer_step // self.interval
        if self.method == "memory":
            self._snapshot = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
            self._snapshot_version = version
            return version
        path = self.version_dir(version)
        tmp = self.directory / f".v{version}.{uuid.uuid4().hex}"
        model.save_pretrained(tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)  # a replayed step republishes its version
        os.rename(tmp, path)
        return version

    def latest_version(self) -> int:
        if self.method == "memory":
            return self._snapshot_version
        versions = [int(m[1]) for p in self.directory.glob("v*") if (m := re.fullmatch(r"v(\d+)", p.name))]
        return max(versions, default=0)

    def discard_after(self, version: int) -> None:
        """Forget versions newer than `version`: a resumed trainer will publish them again."""
        if self.method == "checkpoint":
            for newer in range(version + 1, self.latest_version() + 1):
                shutil.rmtree(self.version_dir(newer), ignore_errors=True)

    def version_dir(self, version: int) -> Path:
        return self.directory / f"v{version}"

    def pull(self, engine: RolloutEngine, version: int) -> None:
        """Load `version` into the engine (version 0 is what it started with)."""
        if version == engine.model_version:
            return
        if self.method == "memory":
            if version != self._snapshot_version:
                raise RuntimeError(f"memory sync holds version {self._snapshot_version}, not {version}")
            engine.load_state_dict(self._snapshot, version)
        else:
            engine.load_checkpoint(self.version_dir(version), version)
