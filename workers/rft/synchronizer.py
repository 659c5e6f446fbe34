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
`nccl`: a torch.distributed group of the trainer (rank 0) and its explorers (weight_broadcast.py;
gloo on CPU, NCCL on CUDA), for explorers that are workers of their own: no file, no copy through
a disk. The trainer opens the group at its start (Stores.weight_group says where; explorers join
once their engine is up) and sends its current version first; each later version is packed in the
trainer's thread and broadcast from a thread of its own, so training goes on meanwhile. An
explorer receives in a thread of its own into one of two buffer sets (acknowledging once the
checksums match) and loads the newest version it holds when its step needs one: never older than
`required_version`, newer when the trainer is ahead (offset >= 1). A broken group (an explorer or
the trainer died or hung) fails the trainer's next publish with WeightSyncError naming who; the
trainer's duty then restarts from its checkpoint in a new group, which the explorers join.
Either way a version is a plain model's weights: with LoRA, the merged ones (base + adapters).
"""
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path

from .engines import RolloutEngine
from .models import merged_state_dict, save_merged
from .protocols import WeightGroup

SYNC_METHODS = ("memory", "checkpoint", "nccl")
SPLIT_SYNC_METHODS = ("checkpoint", "nccl")  # in mode both, explorers and trainer in workers of their own
# An explorer joins the weight group once its engine is up: vLLM's first start of a big model
# takes minutes (its compile and CUDA graphs), a transfer of SmolLM2 about a second.
JOIN_TIMEOUT_S = 900.0
POLL_S = 0.5  # how often a waiting explorer looks for a new group or version
log = logging.getLogger(__name__)


class Synchronizer:
    def __init__(self, method: str, interval: int = 1, offset: int = 0, directory: str | Path | None = None,
                 tokenizer=None, group: WeightGroup | None = None, timeout_s: float = 120.0,
                 verify_every: int = 1, device="cpu"):
        if method not in SYNC_METHODS:
            raise ValueError(f"unknown synchronizer method {method!r}; known: {', '.join(SYNC_METHODS)}")
        if method == "checkpoint" and directory is None:
            raise ValueError("the checkpoint synchronizer needs a directory")
        if method == "nccl" and group is None:
            raise ValueError("the nccl synchronizer needs a weight group: trainer and explorers in workers of "
                             "their own")
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
        self.broadcast: _Sending | _Receiving | None = None  # nccl: this side of the weight group
        if method == "nccl":
            side = _Sending if group.rank == 0 else _Receiving
            self.broadcast = side(group, timeout_s, verify_every, device)

    def required_version(self, explorer_step: int) -> int:
        return max(0, explorer_step - self.offset) // self.interval

    def is_publish_step(self, trainer_step: int) -> bool:
        return trainer_step % self.interval == 0

    def publish(self, model, trainer_step: int, weights: dict | None = None) -> int:
        """Publish the model's (merged) weights as the version of `trainer_step`. `weights`: those
        weights when the caller has them already (a sharded trainer gathers them: Trainer.full_state)."""
        version = trainer_step // self.interval
        weights = merged_state_dict(model) if weights is None else weights
        if self.method == "nccl":
            self.broadcast.send(weights, version)
            self._latest_version = version
            return version
        if self.method == "memory":
            snapshot = {name: tensor.detach().clone() for name, tensor in weights.items()}
            with self._lock:
                # Newer versions go too: a resumed trainer publishes them again.
                kept = {v: s for v, s in self._snapshots.items() if version - self._kept_versions < v < version}
                self._snapshots = kept | {version: snapshot}
                self._latest_version = version
            return version
        path = self.version_dir(version)
        tmp = self.directory / f".v{version}.{uuid.uuid4().hex}"
        save_merged(model, tmp, weights)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)  # a replayed step republishes its version
        os.rename(tmp, path)
        return version

    def latest_version(self) -> int:
        """The newest version published (an explorer with nccl: received; -1 before the first)."""
        if isinstance(self.broadcast, _Receiving):
            return self.broadcast.latest_version()
        if self.method in ("memory", "nccl"):
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

    def has_sent(self) -> bool:
        """nccl, trainer: a version went to this group (the first one is the trainer's current)."""
        return isinstance(self.broadcast, _Sending) and self.broadcast.sent

    def ready(self) -> bool:
        """nccl, trainer: every explorer has joined the group (True for the other methods)."""
        return not isinstance(self.broadcast, _Sending) or self.broadcast.ready()

    def check(self) -> None:
        """Raise what broke the weight group since the last publish (nccl: WeightSyncError)."""
        if isinstance(self.broadcast, _Sending):
            self.broadcast.check()

    def close(self) -> None:
        if self.broadcast is not None:
            self.broadcast.close()

    def pull(self, engine: RolloutEngine, version: int) -> None:
        """Load `version` into the engine (version 0 is what it started with); nccl: the newest
        version received, at least `version` (latest_version() says whether it is there)."""
        if isinstance(self.broadcast, _Receiving):
            self.broadcast.load_newest(engine, version)
            return
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


def _reachable(host: str, port: int) -> bool:
    """Whether a server listens at host:port (a TCPStore client would retry a dead address until
    its 15-minute join timeout)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


class _Sending:
    """The trainer's side of an nccl group: opened at once (the explorers join in the background
    while the trainer loads), each version packed in the caller's thread and broadcast from a
    thread of its own; an error there is raised by the next send or check()."""

    def __init__(self, group: WeightGroup, timeout_s: float, verify_every: int, device):
        from .distributed import free_port

        self.group, self.sent, self._closing = group, False, False
        self.secret = group.secret
        self.generation, self.host, self.port, explorers = group.open(free_port())
        self.sender = None
        self.error: Exception | None = None
        self._transmitting: threading.Thread | None = None
        self._joined = threading.Thread(target=self._join, args=(explorers, timeout_s, verify_every, device),
                                        daemon=True, name="weight group join")
        self._joined.start()

    def _join(self, explorers, timeout_s, verify_every, device) -> None:
        from .weight_broadcast import Sender

        try:
            self.sender = Sender(self.host, self.port, explorers, timeout_s=timeout_s, device=device,
                                 verify_every=verify_every, join_timeout_s=JOIN_TIMEOUT_S, secret=self.secret)
        except Exception as err:  # noqa: BLE001 - raised in the trainer's thread by send/check
            self.error = err

    def send(self, weights: dict, version: int) -> None:
        """Once the previous version is through: pack this one (the trainer may change its weights
        when this returns) and broadcast it in the background."""
        self._joined.join()
        if self._transmitting is not None:
            self._transmitting.join()
        self.check()
        manifest = self.sender.prepare(weights, version)
        self._transmitting = threading.Thread(target=self._transmit, args=(manifest,), daemon=True,
                                              name=f"weights v{version}")
        self._transmitting.start()
        self.sent = True

    def _transmit(self, manifest) -> None:
        try:
            self.sender.transmit(manifest)
        except Exception as err:  # noqa: BLE001 - raised in the trainer's thread by send/check
            self.error = err
        finally:
            if self._closing:  # close() did not wait for this one
                self.sender.close()

    def ready(self) -> bool:
        """Every explorer has joined (or the join failed: check() says why)."""
        return not self._joined.is_alive()

    def check(self) -> None:
        if self.error is not None:
            from .weight_manifest import WeightSyncError

            raise WeightSyncError(f"the weight group broke: {self.error}") from self.error

    def close(self) -> None:
        """The explorers take the last version while the run is still running (they stop after
        it ends); an explorer stopped already is not waited for beyond a few seconds."""
        self._closing = True
        if self._transmitting is not None:
            self._transmitting.join(timeout=10)
        self.group.close(self.generation)
        if self.sender is not None and not (self._transmitting and self._transmitting.is_alive()):
            self.sender.close()


class _Receiving:
    """An explorer's side of an nccl group: a thread joins the trainer's newest group and receives
    every version into one of two buffer sets (the engine loads from the other meanwhile),
    acknowledging each once its checksums match; the explorer loads the newest when it needs one.
    A group that breaks is left for the next one the trainer opens."""

    def __init__(self, group: WeightGroup, timeout_s: float, verify_every: int, device):
        self.group, self.timeout_s, self.device = group, timeout_s, device
        self._changed = threading.Condition()
        self._sets: list[dict] = []  # two buffer sets, by dtype
        self._pending = None  # (manifest, buffers): received, not loaded yet
        self._loading = None  # the buffers the engine is loading from
        self._latest = -1  # the newest version received in the current group
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="weight receiver")
        self._thread.start()

    def latest_version(self) -> int:
        with self._changed:
            return self._latest

    def load_newest(self, engine: RolloutEngine, version: int) -> None:
        with self._changed:
            pending, self._pending = self._pending, None
            if pending is None:
                if self._latest < version:
                    raise RuntimeError(f"weights version {version} has not arrived (newest: {self._latest})")
                return  # loaded already
            manifest, buffers = pending
            self._loading = buffers
        try:
            engine.load_state_dict(dict(manifest.views(buffers)), manifest.version)
        finally:
            with self._changed:
                self._loading = None
                self._changed.notify_all()

    def close(self) -> None:
        """Stop receiving (a version being received is taken first)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=self.timeout_s + 5)

    # -- the receiving thread --------------------------------------------------------------------

    def _serve(self) -> None:
        from .weight_broadcast import Receiver

        done = 0  # the newest generation joined (and over, once we are back here)
        while not self._closed:
            address = self.group.current()
            if address is None or address[0] <= done:
                time.sleep(POLL_S)
                continue
            generation, host, port, explorers = address
            if not _reachable(host, port):  # a group its trainer never closed (killed): wait for the next
                time.sleep(POLL_S)
                continue
            done = generation
            receiver = None
            try:
                receiver = Receiver(host, port, self.group.rank, explorers + 1, self.timeout_s, self.device,
                                    join_timeout_s=JOIN_TIMEOUT_S, secret=self.group.secret)
                with self._changed:
                    self._pending, self._latest = None, -1  # the new group starts from the trainer's current
                while not self._closed:
                    if receiver.announced(POLL_S) and not self._closed:
                        self._receive(receiver)
            except Exception as err:  # noqa: BLE001 - the trainer's side names it; we wait for its next group
                if not self._closed:
                    # The trainer closes its group at the end of every run: say so quietly. The
                    # error's first line only (c10d appends its C++ stack).
                    now = self.group.current()
                    closed = now is None or now[0] != generation
                    (log.info if closed else log.warning)("weight group %s at %s:%s is over%s: %s", generation, host,
                                                          port, " (its trainer closed it)" if closed else "",
                                                          str(err).splitlines()[0] if str(err) else type(err).__name__)
            finally:
                if receiver is not None:
                    receiver.close()

    def _receive(self, receiver) -> None:
        manifest = None
        try:
            manifest, buffers = receiver.receive(into=self._free_set)
            received = receiver.verify(manifest, buffers)
        except Exception as err:
            if manifest is not None:
                receiver.acknowledge(manifest, error=f"{type(err).__name__}: {err}")
            raise
        with self._changed:
            self._pending, self._latest = (manifest, buffers), manifest.version
        receiver.acknowledge(manifest, received)

    def _free_set(self, manifest) -> dict:
        """A buffer set neither pending nor being loaded (waiting for a load to end if need be)."""
        import torch

        with self._changed:
            fits = all(self._fits(buffers, manifest) for buffers in self._sets)
            if len(self._sets) < 2 or not fits:
                self._sets = [{dtype: torch.empty(n, dtype=getattr(torch, dtype), device=self.device)
                               for dtype, n in manifest.sizes.items()} for _ in range(2)]
            while True:
                busy = {id(self._loading), id(self._pending[1]) if self._pending else None}
                free = [buffers for buffers in self._sets if id(buffers) not in busy]
                if free:
                    return free[0]
                self._changed.wait(POLL_S)

    @staticmethod
    def _fits(buffers: dict, manifest) -> bool:
        return all(dtype in buffers and buffers[dtype].numel() == n for dtype, n in manifest.sizes.items())
