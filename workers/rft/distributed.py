"""Data-parallel training (trainer.strategy 'ddp' and 'fsdp'): the ranks, their collectives, and launching them.

Rank 0 is the leader: it runs the loop as one process would (explorer, buffer, metrics,
checkpoints, weight sync) and alone talks to storage. Ranks >= 1 are followers: each holds a
replica of the trainer's models and runs what the leader sends it (Trainer.follow): a step's
batch, a checkpoint to load, stop. Every rank computes on its share of the batch's micro-batches
(round robin) and the gradients are summed across ranks once per update. Each micro-batch's loss
is weighted by its units over its part's units in the WHOLE batch (every rank has the whole batch,
so no count needs reducing), so the summed gradient is exactly the one-process gradient, and so
are the clip by its norm and the optimizer step every rank then takes.

Why an all-reduce by hand and not torch DDP (or accelerate's `prepare`, which wraps the model in
it): DDP all-reduces inside every backward not under no_sync and needs every rank to run the same
number of them; 9 micro-batches over 2 ranks run 5 and 4, and DDP hangs on the difference (or
needs zero-weight dummy passes). And DDP averages where the token-mean needs a sum. One flattened
all-reduce after accumulation moves the same bytes as DDP's buckets; what it gives up is
overlapping them with the backward, which pays on many GPUs with big models, not at 135M parameters.
Seconds per step (bench/trainer_ranks.py, 2 CPU cores): tiny 0.26 on 1 rank, 0.23 on 2; SmolLM2
9.9 and 9.5. Two ranks on the cores one rank already uses gain little: ranks pay off a GPU each.

With trainer.strategy 'fsdp' (torch FSDP2, `fully_shard`) every rank holds 1/N of each weight,
gradient and optimizer state (`shard`): each decoder layer is its own unit, whose weights are
all-gathered inside its forward (and again in backward when resharded after forward) and whose
gradients are reduce-scattered inside its backward, summed (divide factor 1: the same unit
weighting as above makes the sum the one-process gradient). Those collectives run inside every
forward and backward, so every rank runs as many as the others, in the same order: a rank with
fewer micro-batches (9 over 2 ranks: 5 and 4) runs stand-ins weighted 0 (Trainer._share). What the
leader alone did with the full weights (the explorer's copy, a checkpoint) gathers them first, a
command ('gather') every rank takes part in; the leader alone writes them. What it buys, per rank
(bench/trainer_ranks.py, SmolLM2's shape, 2 CPU ranks): 1,574 MB resident after a step under fsdp,
2,592 MB under ddp; at the price of a gather per layer per pass (66.5 s per step against 46.8 s).

Gradients are summed over NCCL on GPUs (a rank per GPU), gloo on CPU, with
trainer.collective_timeout_s; a collective that fails names the ranks that did not answer.
Followers wait for the leader's next command on a group of their own with a day's timeout, since
the leader may explore for hours between two trainer steps; a leader that dies is caught sooner by
`launch`, which ends the other ranks when one fails.

Trust. Nothing a rank receives is unpickled: commands, their arguments (a step's batch as its
experiences' fields) and metric sums travel as JSON in byte tensors. And no rank trusts a group
before its peers have proven they know the group's secret (`handshake`: the run's own secret,
from the database, never from a field a web user edits; RFTWEB_GROUP_SECRET for a process the
leader starts): a process that merely reaches the store (its address is on the run) learns
nothing and sends nothing that is acted on. The store listens on the address it is given
(RFTWEB_NODE_ADDRESS for a run's trainer), not on every interface.
"""
import hashlib
import hmac
import json
import os
import secrets
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .experience import Experience, PreferencePair
from .sampling import TrainBatch

IDLE_TIMEOUT = timedelta(days=1)  # a follower waiting for the leader's next command
SECRET_ENV = "RFTWEB_GROUP_SECRET"  # how a follower process started by its leader gets the group's secret
POLL_S = 0.1  # how often the leader looks for ranks still to join (and whether to stop waiting)


class RankFailure(RuntimeError):
    """A collective failed or timed out: a rank died or hung."""


class GroupRefused(Exception):
    """A peer did not prove it knows the group's secret: this rank refuses the group."""


class JoinCancelled(Exception):
    """The leader stopped waiting for its ranks to join (its run is no longer to be served)."""


class Ranks:
    """This process's place among the trainer's ranks, and the collectives the trainer uses."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, store: dist.Store, device: torch.device):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.store = store  # the process group's rendezvous: it outlives a broken connection
        self.device = device  # where the default group's collectives take their tensors
        self.failed = False  # a collective failed: the group is broken, send no more commands
        self.commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def share(self, items: list) -> list:
        """This rank's items: every world_size-th, from its rank on."""
        return items[self.rank :: self.world_size]

    # -- the leader's commands -------------------------------------------------------------------

    def send(self, command: str, *args) -> None:
        """Leader: have every follower run `command` (Trainer.follow). Guarded as the collectives
        are: a follower that died between two commands breaks this broadcast first."""
        payload = _to_bytes({"command": command, "args": [encode_argument(arg) for arg in args]})
        self._guard(lambda: self._broadcast_bytes(payload))

    def receive(self) -> tuple[str, tuple]:
        """Follower: the leader's next command and its arguments."""
        message = json.loads(self._broadcast_bytes(None))
        return message["command"], tuple(decode_argument(arg) for arg in message["args"])

    def _broadcast_bytes(self, payload: bytes | None) -> bytes:
        """The leader's bytes on every rank, over the command group: their length, then them."""
        length = torch.tensor([len(payload) if self.is_leader else 0], dtype=torch.int64)
        dist.broadcast(length, src=0, group=self.commands)
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if self.is_leader
                else torch.empty(int(length.item()), dtype=torch.uint8))
        dist.broadcast(data, src=0, group=self.commands)
        return payload if self.is_leader else data.numpy().tobytes()

    # -- collectives -----------------------------------------------------------------------------

    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Sum the tensors across ranks, in place: one all-reduce over them flattened."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._guard(lambda: dist.all_reduce(flat))
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        """Each key's sum over the ranks (a rank without the key adds 0). Each rank's values go as
        JSON bytes: their lengths gathered first, then the bytes padded to the longest."""
        mine = torch.frombuffer(bytearray(_to_bytes(values)), dtype=torch.uint8).to(self.device)
        lengths = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        self._guard(lambda: dist.all_gather(lengths, torch.tensor([mine.numel()], device=self.device)))
        longest = max(int(n.item()) for n in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[: mine.numel()] = mine
        gathered = [torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in range(self.world_size)]
        self._guard(lambda: dist.all_gather(gathered, padded))
        total = {}
        for part, n in zip(gathered, lengths):
            for key, value in json.loads(part[: int(n.item())].cpu().numpy().tobytes()).items():
                total[key] = total.get(key, 0.0) + value
        return total

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """The leader's weights on every rank (a critic's fresh head is drawn per process)."""
        for tensor in module.state_dict().values():
            self._guard(lambda t=tensor: dist.broadcast(t, src=0))

    def _guard(self, collective: Callable[[], object]) -> None:
        try:
            collective()
        except (RuntimeError, dist.DistError) as err:
            self.failed = True
            raise RankFailure(f"rank {self.rank} of {self.world_size}: {self._blame()}; {err}") from err

    def _blame(self) -> str:
        """Which ranks are gone. A failed collective fails on every live rank, and each signs in
        at the store here; the ranks that have not within the timeout died or hang. (Not gloo's
        monitored_barrier: its message for a dead rank is 'Connection closed by peer [ip]:port'.)"""
        self.store.set(f"rank-failure/{self.rank}", "1")
        deadline = time.monotonic() + self.timeout_s
        gone = []
        for rank in range(self.world_size):
            key = f"rank-failure/{rank}"
            left = deadline - time.monotonic()
            if left > 0:
                try:
                    self.store.wait([key], timedelta(seconds=left))
                except (RuntimeError, dist.DistError):
                    pass  # checked just below
            if not self.store.check([key]):
                gone.append(rank)
        if not gone:
            return "every rank reached the failure"
        return f"rank {', '.join(map(str, gone))} gone (no answer within {self.timeout_s:g} s)"


def launch(fn: Callable, world_size: int, *args, timeout_s: float = 300.0, device_type: str = "cpu") -> list:
    """Run fn(ranks, *args) in world_size new processes (ranks 0..world_size-1 on this machine;
    on 'cuda' rank r computes on GPU r), and return their results in rank order (None for a rank
    that exited without one). A rank that fails ends the others and re-raises here. Processes are
    spawned, not forked: torch's thread pools and CUDA do not survive a fork. (Not `accelerate
    launch`: it starts a script from a shell; here a run is a function call of the CLI or a
    worker, which is what accelerate's notebook_launcher does with the same torch.multiprocessing.)
    Results come back as tensors and plain values (torch.load with weights_only)."""
    if device_type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"{world_size} ranks need {world_size} GPUs; this machine has {torch.cuda.device_count()}")
    secret = new_secret()  # the group's: only these processes know it
    with tempfile.TemporaryDirectory(prefix="rft-ranks-") as tmp:
        mp.start_processes(
            _run_rank, args=(fn, args, world_size, free_port(), timeout_s, device_type, tmp, secret),
            nprocs=world_size, join=True, start_method="spawn",
        )
        results = [Path(tmp) / f"{rank}.pt" for rank in range(world_size)]
        return [torch.load(path, weights_only=True) if path.exists() else None for path in results]


def _run_rank(rank: int, fn: Callable, args: tuple, world_size: int, port: int, timeout_s: float, device_type: str,
              out: str, secret: str) -> None:
    ranks = join(rank, world_size, rank, ("127.0.0.1", port, rank == 0), timeout_s, device_type, secret=secret)
    try:
        torch.save(fn(ranks, *args), Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def join_from_env(timeout_s: float, device_type: str) -> Ranks:
    """This process as one rank of a torchrun launch (its RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and RFTWEB_GROUP_SECRET: the same on every
    machine): how the ranks of several machines start."""
    env = os.environ
    # torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; without it, rank 0 does.
    hosts_store = env["RANK"] == "0" and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = (env["MASTER_ADDR"], int(env["MASTER_PORT"]), hosts_store)
    return join(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), store, timeout_s, device_type,
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])))


def join(rank: int, world_size: int, local_rank: int, store: tuple[str, int, bool], timeout_s: float,
         device_type: str, local_world_size: int | None = None, secret: str | None = None,
         should_stop: Callable[[], bool] | None = None) -> Ranks:
    """Join the process group as `rank`; `store`: (host, port, whether this process serves it, on
    that address alone). `secret`: the group's (default: $RFTWEB_GROUP_SECRET); every rank proves
    it knows it before any joins (`handshake`). `should_stop`: the leader gives up waiting for
    ranks to join once it says so (JoinCancelled)."""
    secret = secret or os.environ.get(SECRET_ENV)
    if not secret:
        raise GroupRefused(f"no secret for the trainer's rank group: set {SECRET_ENV} to the same random value for "
                           "every rank (a leader started by a worker passes its run's own)")
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)  # what a model's .to("cuda") and NCCL take as this rank's GPU
    # Each rank its share of the cores: more threads than cores make OpenMP's workers wait on each other.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // (local_world_size or world_size)))
    timeout = timedelta(seconds=timeout_s)
    host, port, is_master = store
    rendezvous = (serve_store(host, port, timeout, world_size=world_size) if is_master else
                  dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout))
    try:
        handshake(rendezvous, rank, world_size, secret, f"{host}:{port}", timeout_s, should_stop)
    except BaseException as err:
        # Stop serving at once: handshake's frame in the traceback holds the store (and its port).
        traceback.clear_frames(err.__traceback__)
        del rendezvous
        raise
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, store=rendezvous, rank=rank, world_size=world_size, timeout=timeout)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return Ranks(rank, world_size, timeout_s, rendezvous, device)


def new_secret() -> str:
    return secrets.token_hex(32)


def serve_store(host: str, port: int, timeout: timedelta, **options) -> dist.TCPStore:
    """A TCPStore served on host:port alone (torch's own server binds to every interface), from a
    socket made here and handed over: the store owns it from then on and closes it when it goes
    (both of torch's servers do). No Python socket may keep it too: closing it again closed
    whichever file had since taken its number (a resumed ddp run failed on EBADF in CI, 2026-12-02).
    It waits for no clients: the callers wait for theirs, naming those that never come."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    fd = socket.create_server((host, port), family=family, backlog=1024).detach()
    return dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=fd, **options)


def handshake(store: dist.Store, rank: int, world_size: int, secret: str, address: str, timeout_s: float,
              should_stop: Callable[[], bool] | None = None) -> None:
    """Rank 0 and each other rank prove to each other that they know `secret`, through the store
    at `address`, before either trusts anything of the other (GroupRefused otherwise). Rank 0
    writes a fresh nonce; rank r answers with its own nonce and an HMAC of rank 0's; rank 0 checks
    it and answers with an HMAC of rank r's. Fresh nonces on both sides: a proof seen once is no
    use again. The address is in every HMAC: a proof made for one store is no use at another (a
    fake leader cannot relay a follower's exchange with the real one)."""
    def proof(role: str, peer: int, nonce: bytes) -> bytes:
        message = f"{role}|{peer}|{address}|".encode() + nonce
        return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest().encode()

    if rank != 0:
        mine = secrets.token_hex(16)
        try:
            store.wait(["auth/leader"], timedelta(seconds=timeout_s))
            store.set(f"auth/{rank}/nonce", mine)
            store.set(f"auth/{rank}/proof", proof("follower", rank, store.get("auth/leader")))
            store.wait([f"auth/{rank}/answer"], timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistError) as err:
            raise GroupRefused(f"rank {rank}: the leader at {address} did not answer within {timeout_s:g} s "
                               "whether it knows the group's secret; refusing to join its group") from err
        if not hmac.compare_digest(store.get(f"auth/{rank}/answer"), proof("leader", rank, mine.encode())):
            # A comma, not a colon, after "secret": the run's logs redact what follows "secret:".
            raise GroupRefused(f"rank {rank}: the leader at {address} did not prove it knows the group's secret, "
                               "so this rank does not join its group (nothing it sent was read): another process at "
                               "that address, such as an earlier group's leader after a restart")
        return
    ours = secrets.token_hex(16)
    store.set("auth/leader", ours)
    waiting, deadline = set(range(1, world_size)), time.monotonic() + timeout_s
    while waiting:
        for peer in sorted(waiting):
            if not store.check([f"auth/{peer}/proof"]):
                continue
            if not hmac.compare_digest(store.get(f"auth/{peer}/proof"), proof("follower", peer, ours.encode())):
                raise GroupRefused(f"rank {peer} at {address} did not prove it knows the group's secret, so the "
                                   "group is refused (something other than the run's own ranks reached its store)")
            store.set(f"auth/{peer}/answer", proof("leader", peer, store.get(f"auth/{peer}/nonce")))
            waiting.discard(peer)
        if not waiting:
            return
        if should_stop is not None and should_stop():
            raise JoinCancelled(f"rank 0 stopped waiting for {len(waiting)} rank(s) to join")
        if time.monotonic() > deadline:
            shown = ", ".join(map(str, sorted(waiting)[:10])) + (" ..." if len(waiting) > 10 else "")
            raise RankFailure(f"rank {shown} of {world_size} did not join within {timeout_s:g} s")
        time.sleep(POLL_S)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for rank 0 to serve the group's store on."""
    with socket.socket(socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# -- what ranks send each other: JSON, never a pickle ----------------------------------------------


BATCH_PARTS = ("usual", "expert", "pairs")


def _to_bytes(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=_array_as_list).encode()


def _array_as_list(value):
    """A store's token arrays (numpy) travel as JSON lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_argument(value):
    """A command's argument as JSON: a TrainBatch as its records' fields, anything else as is
    (a path, a step, a flag)."""
    if isinstance(value, TrainBatch):
        return {"batch": {part: [asdict(item) for item in getattr(value, part)] for part in BATCH_PARTS}}
    return {"value": value}


def decode_argument(value):
    if "batch" in value:
        parts = value["batch"]
        return TrainBatch(usual=[Experience(**e) for e in parts["usual"]],
                          expert=[Experience(**e) for e in parts["expert"]],
                          pairs=[PreferencePair(**p) for p in parts["pairs"]])
    return value["value"]


# -- fsdp ----------------------------------------------------------------------------------------


def shard(model: torch.nn.Module, ranks: Ranks, settings, device: torch.device) -> None:
    """Shard `model` over the ranks in place (FSDP2): each decoder layer (transformers'
    `_no_split_modules`, what accelerate wraps too), then the root (embeddings, final norm, head).
    `settings`: config.FsdpConfig.

    The forward keeps torch.autocast in the compute dtype over fp32 weights, as one process does,
    rather than FSDP's MixedPrecisionPolicy (bf16 all-gathers: half the bytes, but numerics of
    their own): a step stays the one-process step up to summation order."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (ranks.world_size,))
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if settings.cpu_offload else OffloadPolicy()
    options = {"mesh": mesh, "reshard_after_forward": settings.reshard_after_forward, "offload_policy": offload}
    layer_types = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in layer_types]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    for unit in [*layers, model]:
        fully_shard(unit, **options)
        # Sum, not FSDP's default mean over ranks: losses are weighted by the whole batch already.
        # Forced to a plain SUM: a divide factor of 1 otherwise asks for PREMUL_SUM, which gloo lacks.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


FULL = {"full_state_dict": True, "cpu_offload": True}  # gathered on rank 0, in CPU memory


def full_weights(model: torch.nn.Module) -> dict:
    """A sharded model's full state dict on rank 0 ({} on the others); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(**FULL))


def load_full_weights(model: torch.nn.Module, state: dict) -> None:
    """Full weights (every rank has them) into a sharded model: each rank keeps its shard. A saved
    tied model has no output head of its own (it is the embedding), as models.copy_weights allows."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)
    missing, unexpected = set_model_state_dict(model, state, options=options)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"weights do not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A sharded model's optimizer state on rank 0 ({} on the others), in the layout one process's
    `optimizer.state_dict()` has (parameters by position), so a checkpoint loads on any number of
    ranks, fsdp or not. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(**FULL))
    if not state:
        return {}
    position = {name: i for i, name in enumerate(_trained_names(model))}
    return {
        "state": {position[name]: value for name, value in state["state"].items()},
        "param_groups": [{**group, "params": [position[n] for n in group["params"]]} for group in
                         state["param_groups"]],
    }


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """What full_optimizer_state (or one process's optimizer.state_dict()) saved, into the optimizer
    of a sharded model; every rank has it and keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trained_names(model)
    by_name = {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _trained_names(model: torch.nn.Module) -> list[str]:
    """The trained parameters' names in the order the Trainer gives them to its optimizer."""
    return [name for name, p in model.named_parameters() if p.requires_grad]
