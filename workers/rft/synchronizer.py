"""Weights from the trainer to the explorer, by version.

The trainer publishes version N = trainer_step // interval every `interval` steps; version 0 is
the starting model. Explorer step t needs version max(0, t - offset) // interval: with offset 0
the explorer waits for each new version (synchronous), with offset 1 it runs one version behind
(one-step off-policy), and it never runs more than `offset` steps ahead of what it was promised.

`memory`: snapshots of the state dict, copied into the explorer's model in this process. It keeps
the newest ceil(offset / interval) + 1 versions: an explorer step running beside the trainer (the
overlapped loop) may still need one that many versions old; at offset 0, only the newest. Publish
(trainer thread) and pull (explorer thread) may run at the same time.
`checkpoint`: a versioned directory <dir>/v{N}/ (HF save_pretrained, safetensors) that any
process can load; the explorer loads exactly the version it needs.
"""
import os
import re
import shutil
import threading
import uuid
from pathlib import Path

from .engines import RolloutEngine

SYNC_METHODS = ("memory", "checkpoint")


class Synchronizer:
    def __init__(self, method: str, interval: int = 1, offset: int = 0, directory: str | Path | None = None, tokenizer=None):
        if method not in SYNC_METHODS:
            raise ValueError(f"unknown synchronizer method {method!r}; known: {', '.join(SYNC_METHODS)}")
        if method == "checkpoint" and directory is None:
            raise ValueError("the checkpoint synchronizer needs a directory")
        self.method = method
        self.interval = interval
        self.offset = offset
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer  # saved next to the weights, so a version directory is a complete model
        self._lock = threading.Lock()  # memory: the snapshots and the latest version change together
        self._snapshots: dict[int, dict] = {}  # memory: version -> state dict
        self._latest_version = 0
        self._kept_versions = -(-offset // interval) + 1

    def required_version(self, explorer_step: int) -> int:
        return max(0, explorer_step - self.offset) // self.interval

    def is_publish_step(self, trainer_step: int) -> bool:
        return trainer_step % self.interval == 0

    def publish(self, model, trainer_step: int) -> int:
        version = trainer_step // self.interval
        if self.method == "memory":
            snapshot = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
            with self._lock:
                # Newer versions go too: a resumed trainer publishes them again.
                kept = {v: s for v, s in self._snapshots.items() if version - self._kept_versions < v < version}
                self._snapshots = kept | {version: snapshot}
                self._latest_version = version
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
            return self._latest_version
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
            with self._lock:  # a snapshot is never changed once stored: load it outside the lock
                snapshot = self._snapshots.get(version)
                held = sorted(self._snapshots)
            if snapshot is None:
                raise RuntimeError(f"memory sync holds versions {held}, not {version}")
            engine.load_state_dict(snapshot, version)
        else:
            engine.load_checkpoint(self.version_dir(version), version)
