"""Whether a run fits the machines that would serve it: keys each within its limit may add up to a
run no worker can hold (8 tasks x 16 rollouts x 32,768 new tokens was accepted, and its pool
processes were killed one after the other). `fit_issues` refuses what no live worker can hold,
`fit_warnings` says what comes close; both from the engine's estimate (workers/rft/footprint.py)
against each worker's memory, cores and GPUs (hosts.py). Model paths and other launch checks:
config_checks.py."""
from dataclasses import dataclass
from pathlib import Path

from workers.rft.config import ConfigIssue
from workers.rft.footprint import BUILTIN_SHAPES, GB, Footprint, ModelShape, run_footprint
from workers.rft.loop import EXPLORER, TRAINER, components_of
from workers.rft.synchronizer import SPLIT_SYNC_METHODS

from . import hosts
from .config_checks import builtin_dir, model_config
from .hosts import Host

# Warned above this share of a machine's memory: the worker's other slots, the OS, and a database or
# web server beside it share the machine, and the estimate leaves out CUDA's context and the
# allocator's caches (workers/rft/footprint.py). The test machine's 24 GiB idle at ~1.5 GB in use.
CLOSE = 0.7
WEIGHT_PARTS = ("explorer weights", "trainer weights", "gradients", "optimizer", "reference", "critic")


@dataclass(frozen=True)
class _Process:
    """A kind of process the run's duties are (duties.duties_of): `loop` runs what the mode
    needs in one train worker's process; with checkpoint or nccl sync the explorers and the
    trainer run apart. A trainer's further machines (node duties) hold no more than `trainer`.
    Each is checked alone: two that land in the slots of one worker share its memory, as the runs
    of its other slots do (CLOSE)."""

    duty: str
    queue: str
    explorer: bool
    trainer: bool


@dataclass
class _Verdict:
    host: Host
    need: Footprint | None  # None: the model's shape is unknown
    have: int | None  # bytes of the memory it would fill (RAM, or the smallest GPU used); None: unknown
    problems: list[tuple[str, str]]  # (key, why) it cannot host the run
    ranks: int = 1  # the trainer ranks the memory holds (on CPU, every rank of the machine's)

    @property
    def close(self) -> bool:
        return self.need is not None and self.have is not None and self.need.total > CLOSE * self.have


def fit_issues(config) -> list[ConfigIssue]:
    """Why no live worker of a queue could host the run, naming the keys (a launch is refused on
    them): a process's estimated memory (workers/rft/footprint.py) over what the worker has, or
    more trainer ranks a machine than it has cores or GPUs. With no live worker on a queue there is
    nothing to refuse against: fit_warnings checks this machine instead."""
    return _fit(config)[0]


def fit_warnings(config) -> list[str]:
    """What may not fit: a live worker that could not host the run while another could (Celery
    hands a duty to whichever worker takes it first), one it would fill past CLOSE, and, with no
    live worker on a queue, this machine. That is a warning, not a refusal: workers usually start
    beside the server, but one may yet start on a larger machine."""
    return _fit(config)[1]


def _fit(config) -> tuple[list[ConfigIssue], list[str]]:
    shape = _shape(config.model.path)
    issues, warnings = [], []
    for process in _processes(config):
        serving = hosts.serving(process.queue)
        verdicts = [_verdict(config, shape, process, host) for host in serving or [hosts.this_machine()]]
        hosting = [verdict for verdict in verdicts if not verdict.problems]
        if serving and not hosting:
            best = min(verdicts, key=lambda v: (len(v.problems), -(v.have or 0)))
            others = len(verdicts) - 1
            nor = f"; nor could the other {others} live `{process.queue}` worker(s)" if others else ""
            issues += [ConfigIssue(key, f"{why}{nor}") for key, why in best.problems]
            continue
        where = "" if serving else (f"No live `{process.queue}` worker to check this run against, so "
                                    f"{hosts.THIS_MACHINE} stands in: ")
        then = " Celery hands a duty to whichever worker of its queue takes it first." if serving else ""
        for verdict in verdicts:
            if verdict.problems:
                warnings += [f"{where}{key}: {why}.{then}" for key, why in verdict.problems]
            elif verdict.close:
                close = _close(config, process, verdict)
                warnings.append(where + close if where else close[0].upper() + close[1:])
    return issues, warnings


def _processes(config) -> list[_Process]:
    components = components_of(config)
    if config.mode == "both" and config.synchronizer.method in SPLIT_SYNC_METHODS:
        return [_Process("explorer", "explore", True, False), _Process("trainer", "train", False, True)]
    return [_Process("loop", "train", EXPLORER in components, TRAINER in components)]


def _shape(path: str) -> ModelShape | None:
    """The policy's shape from its config.json (a built-in one before it is built)."""
    directory = builtin_dir(path) if path in BUILTIN_SHAPES else Path(path)
    return ModelShape.from_config(model_config(directory)) or BUILTIN_SHAPES.get(path)


def _verdict(config, shape: ModelShape | None, process: _Process, host: Host) -> _Verdict:
    device, trainer = config.model.device, config.trainer
    on_gpu = device == "cuda" or (device == "auto" and bool(host.gpus))
    ranks = trainer.num_processes if process.trainer and trainer.strategy != "single" else 1
    problems = []
    if device == "cuda" and not host.gpus:
        problems.append(("model.device", f"is cuda, and {host.name} has no GPU"))
    elif on_gpu and ranks > len(host.gpus):
        problems.append(("trainer.num_processes", f"{ranks} ranks need a GPU each, and {host.name} has "
                                                  f"{len(host.gpus)}"))
    elif not on_gpu and host.cpus is not None and ranks > host.cpus:
        # distributed.join gives each rank cores // ranks threads, at least one: more ranks than
        # cores only take turns, each holding a whole trainer (64 of SmolLM2 asked for ~30 GB).
        problems.append(("trainer.num_processes", f"{ranks} ranks on {host.name}, which has {host.cpus} "
                                                  f"cores: at most {host.cpus}, one a core (more only take "
                                                  "turns, each holding a trainer of its own)"))
    if shape is None:
        return _Verdict(host, None, None, problems)
    need = run_footprint(config, shape, on_gpu).process(process.explorer, process.trainer, on_gpu)
    have = min(host.gpus[:ranks]) if on_gpu and host.gpus else host.memory
    verdict = _Verdict(host, need, have, problems, 1 if on_gpu else ranks)
    if have is not None and need.total > have:
        key, lower = _lowering(config, need, verdict.ranks)
        problems.append((key, f"this run's `{process.duty}` duty would take about {_gb(need.total)}, and "
                              f"{'a GPU of ' if on_gpu else ''}{host.name} has {_gb(have)}: "
                              f"{_parts(config, need, verdict.ranks)}. Lower {lower}"))
    return verdict


def _close(config, process: _Process, verdict: _Verdict) -> str:
    need, have = verdict.need, verdict.have
    _, lower = _lowering(config, need, verdict.ranks)
    return (f"this run's `{process.duty}` duty would take up to about {_gb(need.total)}, {need.total / have:.0%} of "
            f"the {_gb(have)} that {verdict.host.name} has for it, its other slots, the system and anything "
            f"beside it: {_parts(config, need, verdict.ranks)}. Lower {lower} to leave more room.")


def _parts(config, need: Footprint, ranks: int) -> str:
    """The largest parts, then what sets their size."""
    largest = [name for name, _ in need.largest(3)]
    sizes, rollouts = [], config.explorer.batch_size * config.algorithm.repeat_times
    if any(name.startswith("explorer") and name != "explorer weights" for name in largest):
        sizes.append(f"explorer.batch_size x algorithm.repeat_times {rollouts}")
    if any(name in ("trainer activations", "attention", "logits") for name in largest):
        sizes.append(f"trainer.micro_batch_size {config.trainer.micro_batch_size}")
    if "batch" in largest:
        sizes.append(f"trainer.batch_size {config.train_batch_size}")
    rows = (f" ({' and '.join(sizes)} rows of model.max_prompt_tokens {config.model.max_prompt_tokens} + "
            f"explorer.max_new_tokens {config.explorer.max_new_tokens} tokens)") if sizes else ""
    each = f"; {ranks} ranks, each a trainer of its own" if ranks > 1 else ""
    return ", ".join(f"{name} {_gb(size)}" for name, size in need.largest(3)) + rows + each


def _lowering(config, need: Footprint, ranks: int) -> tuple[str, str]:
    """(the key to name, the keys to lower) for the largest parts of `need`. A row's tokens size
    both the explorer's cache and the trainer's micro-batches: its larger term comes first (a
    prompt is counted at model.max_prompt_tokens, where a longer one is cut)."""
    new, prompt = config.explorer.max_new_tokens, config.model.max_prompt_tokens
    tokens = ["explorer.max_new_tokens"] if new >= prompt else ["model.max_prompt_tokens"]
    keys = []
    for name, _ in need.largest(3):
        if name in WEIGHT_PARTS:
            keys += ["model.path (a smaller model)", "model.lora (only adapters train)",
                     "trainer.strategy fsdp (states sharded over ranks)"]
        elif name == "batch":
            keys.append("trainer.batch_size")
        elif name.startswith("explorer") or name == "rollouts":
            keys += [*tokens, "explorer.batch_size x algorithm.repeat_times"]
        else:
            keys += [*tokens, "trainer.micro_batch_size"]
    if ranks > 1:
        keys.append("trainer.num_processes")
    keys = list(dict.fromkeys(keys))
    lower = ", ".join(keys[:-1]) + f" or {keys[-1]}" if len(keys) > 1 else keys[0]
    return keys[0].split(" ")[0], lower


def _gb(size: int) -> str:
    return f"{size / GB:.1f} GB"
