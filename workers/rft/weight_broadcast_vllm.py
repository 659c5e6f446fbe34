"""The broadcast synchroniser's receiving end inside vLLM's worker, through vLLM's own
weight-transfer API (vllm/distributed/weight_transfer/, vLLM >= 0.32): a backend of ours,
`rft_gloo`, registered in vLLM's WeightTransferEngineFactory when the worker imports this module,
which it does because the engine names `BroadcastWorkerExtension` as its `worker_extension_cls`.

Why our own backend and not vLLM's `nccl` one: that one builds a PyNccl communicator (CUDA only)
and is fed by vLLM's trainer-side engine; on CPU there is no NCCL. Ours speaks weight_broadcast's
protocol (one manifest, one buffer per dtype, an acknowledgement in the store), with gloo on CPU
and NCCL on CUDA, so a trainer sends the same way to transformers and vLLM explorers.
What vLLM's API gives us, and we keep: the worker's `init_weight_transfer_engine` /
`start_weight_update` / `update_weights` / `finish_weight_update` (gpu_worker.py, inherited by
the CPU worker) and the layer-wise reload around `model.load_weights` (start: initialize_
layerwise_reload; finish: finalize_layerwise_reload, which re-runs process_weights_after_loading:
on CPU it re-packs the linear layers). `update_weights` ends with torch.accelerator.synchronize()
(base.py), harmless on CPU: the CPU model runner replaces it with a no-op
(v1/worker/cpu_model_runner.py, _set_torch_accelerator_to_noop).

After finalize, tied heads are re-processed (the CPU trap described in engines/vllm_weights.py:
a tied lm_head receives no weight of its own, so the reload never repacks it) and checked; the
acknowledgement the trainer waits for is sent only then.

Explorer side, with `llm` a vllm.LLM built with
    worker_extension_cls=WORKER_EXTENSION, weight_transfer_config={"backend": BACKEND}:
    join(llm, host, port, rank, world_size, secret)  # once, while the trainer's Sender is constructed
    receive(llm)                                 # per version, while the trainer sends it
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .engines.vllm_weights import RFTWorkerExtension, refresh_tied_modules, stale_tied
from .weight_broadcast import DEFAULT_TIMEOUT_S, IDLE_TIMEOUT_S, Receiver
from .weight_manifest import fingerprint

BACKEND = "rft_gloo"
WORKER_EXTENSION = f"{__name__}.BroadcastWorkerExtension"


@dataclass
class BroadcastInitInfo(WeightTransferInitInfo):
    host: str
    port: int
    rank: int
    world_size: int
    secret: str  # the group's, which both sides prove they know (distributed.handshake)
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str | None = None
    idle_timeout_s: float = IDLE_TIMEOUT_S


@dataclass
class BroadcastUpdateInfo(WeightTransferUpdateInfo):
    """Nothing: the version, names and shapes come in the broadcast manifest."""


class BroadcastWeightTransferEngine(WeightTransferEngine[BroadcastInitInfo, BroadcastUpdateInfo]):
    init_info_cls = BroadcastInitInfo
    update_info_cls = BroadcastUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver: Receiver | None = None
        self._manifest = None
        self._digest: str | None = None
        self.version = 0
        # Parameters vLLM keeps exactly as sent (on CPU: the embedding and the norms; linear
        # layers are fused and repacked): found at the first version, checked bit for bit after
        # every later one (as engines/vllm_engine.py calibrates against the model's files).
        self.comparable: set[str] | None = None
        self.verified: list[str] = []
        self.seconds: dict[str, float] = {}  # where the last update's time went (bench/weight_sync.py)

    def init_transfer_engine(self, init_info: BroadcastInitInfo) -> None:
        # The group on the worker's device: NCCL on CUDA, gloo on CPU (weight_broadcast._Group).
        self.receiver = Receiver(init_info.host, init_info.port, init_info.rank, init_info.world_size,
                                 init_info.timeout_s, device=self.device, name=init_info.name,
                                 idle_timeout_s=init_info.idle_timeout_s, secret=init_info.secret)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._manifest, self._digest = None, None
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: BroadcastUpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        if self.receiver is None:
            raise RuntimeError("init_weight_transfer_engine first")
        try:
            started = time.perf_counter()
            manifest, buffers = self.receiver.receive()
            received = time.perf_counter()
            self._manifest = manifest
            self._digest = self.receiver.verify(manifest, buffers)
            verified = time.perf_counter()
            with disable_mtp_completeness_check():
                # Views into the receive buffers: load_weights copies (and shards) them into vLLM's layout.
                self.model.load_weights(manifest.views(buffers))
            self.seconds = {"receive": received - started, "verify": verified - received,
                            "load_weights": time.perf_counter() - verified}
        except Exception as err:
            self._fail(err)
            raise

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        try:
            started = time.perf_counter()
            finalize_layerwise_reload(self.model, self.model_config)
            finalized = time.perf_counter()
            stale = stale_tied(refresh_tied_modules(self.model))
            if stale:
                raise RuntimeError(f"tied modules compute with stale weights: {sorted(stale)}")
            self._check_loaded()
            self.seconds |= {"finalize": finalized - started, "tied_and_check": time.perf_counter() - finalized}
        except Exception as err:
            self._fail(err)
            raise
        if self._manifest is not None:
            self.version = self._manifest.version
            self.receiver.acknowledge(self._manifest, self._digest)

    def _check_loaded(self) -> None:
        """The parameters vLLM holds as sent must have the sent checksums (exact)."""
        if self._manifest is None or not self._manifest.checksums:
            return
        sent = self._manifest.checksums
        held = {name: p for name, p in self.model.named_parameters() if name in sent}
        got = fingerprint((name, p) for name, p in held.items() if not p.is_meta)
        same = {name for name, value in got.items() if value == sent[name]}
        if self.comparable is None:
            self.comparable = same
        wrong = sorted(self.comparable - same)
        if wrong:
            raise RuntimeError(f"vLLM holds other values than were sent for {len(wrong)} tensors: {wrong[:3]}")
        self.verified = sorted(self.comparable)

    def _fail(self, err: Exception) -> None:
        if self._manifest is not None and self.receiver is not None:
            self.receiver.acknowledge(self._manifest, error=f"{type(err).__name__}: {err}")

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None


if BACKEND not in WeightTransferEngineFactory._registry:  # imported again in one process: registered once
    WeightTransferEngineFactory.register_engine(BACKEND, BroadcastWeightTransferEngine)


class BroadcastWorkerExtension(RFTWorkerExtension):
    """The engine's worker extension plus what the broadcast needs; importing this module in the
    worker (vLLM resolves worker_extension_cls before it loads the model and creates the transfer
    engine) registers the backend."""

    def rft_receive_broadcast(self) -> dict:
        """vLLM's update session (start / update / finish: the worker methods of gpu_worker.py,
        driving our engine) in ONE call from the explorer: each collective_rpc is a round trip
        through the engine core, ~50-100 ms on a loaded 2-core machine (bench/weight_sync.py)."""
        self.start_weight_update()
        self.update_weights({})
        self.finish_weight_update()
        return self.rft_broadcast_report()

    def rft_broadcast_report(self) -> dict:
        """The version last taken, the digest of what arrived, the parameters checked bit for bit."""
        engine = self.weight_transfer_engine
        if not isinstance(engine, BroadcastWeightTransferEngine):
            return {"version": 0, "digest": None, "verified": [], "seconds": {}}
        return {"version": engine.version, "digest": engine._digest, "verified": engine.verified,
                "seconds": engine.seconds}


# ---------------------------------------------------------------------------------------------
# Explorer process side: driving the worker through the offline LLM's collective_rpc


def engine_options() -> dict:
    """What vllm.LLM(...) needs for this backend (engines/vllm_engine.py would add these)."""
    return {"worker_extension_cls": WORKER_EXTENSION, "weight_transfer_config": {"backend": BACKEND}}


def join(llm, host: str, port: int, rank: int, world_size: int, secret: str, timeout_s: float = DEFAULT_TIMEOUT_S,
         name: str | None = None) -> None:
    """Have the worker join the trainer's weight group (blocks until the group is complete)."""
    info = {"host": host, "port": port, "rank": rank, "world_size": world_size, "secret": secret,
            "timeout_s": timeout_s, "name": name}
    llm.collective_rpc("init_weight_transfer_engine", args=(info,))


def receive(llm) -> dict:
    """Take the version the trainer is sending. The worker acknowledges to the trainer; returns
    its report (rft_broadcast_report: version, digest, verified parameter names, seconds)."""
    [report] = llm.collective_rpc("rft_receive_broadcast")
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
    return report

