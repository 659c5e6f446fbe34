"""In-memory implementations of the storage protocols, for the headless CLI, benchmarks and tests.

Tasksets are named as in the run config. Headless, a name is either a JSONL file (one task per
line: {"prompt", "answer", "metadata", "difficulty"}) or a built-in generator with parameters:

    arithmetic                                   datasets.generate('arithmetic', 100, seed=0)
    arithmetic:n=1000,max_operand=9,ops=+,split=train

`split=train|eval` keeps distinct prompts only and holds out a fixed fifth of them (by a hash of
the prompt) as `eval`, so an eval split never shares a prompt with its train split.

The explorer and trainer threads of an overlapped loop (loop.py) share these stores: a lock
guards whatever both may read and change.
"""
import json
import secrets
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from . import datasets
from .experience import EXPERT_SOURCES, SOURCES, Experience, PreferencePair, Task, TaskKey, TaskStats
from .protocols import Stores
from .sampling import HUMAN_REWARD, USUAL_SOURCES, apply_human_feedback, sample_key

EVAL_FRACTION = 5  # one prompt in five is held out


def parse_taskset_spec(spec: str) -> tuple[str, dict]:
    name, _, params = spec.partition(":")
    values = {}
    for item in filter(None, params.split(",")):
        key, _, value = item.partition("=")
        values[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return name.strip(), values


def load_tasks(spec: str) -> list[Task]:
    """Tasks for a taskset name (see the module doc), numbered from 0."""
    if spec.endswith(".jsonl") or Path(spec).is_file():
        rows = [json.loads(line) for line in Path(spec).read_text().splitlines() if line.strip()]
    else:
        name, params = parse_taskset_spec(spec)
        n, seed, split = params.pop("n", 100), params.pop("seed", 0), params.pop("split", None)
        rows = datasets.generate(name, n, seed=seed, **params)
        if split is not None:
            rows = held_out_split(rows, split)
    return [Task(id=i, **row) for i, row in enumerate(rows)]


def held_out_split(rows: list[dict], split: str) -> list[dict]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    distinct = {json.dumps(row["prompt"]): row for row in rows}
    held_out = {key for key in distinct if zlib.crc32(key.encode()) % EVAL_FRACTION == 0}
    return [row for key, row in distinct.items() if (key in held_out) == (split == "eval")]


class InMemoryTaskSource:
    def __init__(self, tasks: Sequence[Task]):
        self._tasks = {task.id: task for task in tasks}
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str) -> "InMemoryTaskSource":
        return cls(load_tasks(spec))

    def tasks(self) -> list[Task]:
        # Copies, as the Postgres source's fresh rows: a caller's list is a snapshot that a later
        # mark_sampled does not change under it.
        with self._lock:
            return [replace(task) for task in self._tasks.values()]

    def task_keys(self, with_stats: bool = False) -> list[TaskKey]:
        with self._lock:
            return [TaskKey(task.id, task.priority, task.times_sampled, task.stats if with_stats else None)
                    for task in self._tasks.values()]

    def tasks_with_ids(self, task_ids: Sequence[int]) -> list[Task]:
        with self._lock:
            return [replace(self._tasks[task_id]) for task_id in task_ids]

    def mark_sampled(self, task_ids: Sequence[int], stats: Mapping[int, TaskStats] | None = None) -> None:
        with self._lock:
            for task_id in task_ids:
                self._tasks[task_id].times_sampled += 1
            for task_id, learned in (stats or {}).items():
                self._tasks[task_id].stats = learned

    def count_solved(self, streak: int) -> int:
        with self._lock:
            return sum(task.stats is not None and task.stats.solved_streak >= streak for task in self._tasks.values())

    def add_tasks(self, tasks: Sequence[Task]) -> list[Task]:
        with self._lock:
            next_id = max(self._tasks, default=-1) + 1
            added = [replace(task, id=next_id + i, times_sampled=0, stats=None) for i, task in enumerate(tasks)]
            self._tasks.update((task.id, replace(task)) for task in added)
        return added


class InMemoryBuffer:
    """Statuses as in Postgres: 'ready' until trained on, then 'consumed' (rollouts only)."""

    STALE_SOURCES = ("rollout", "synthetic")

    def __init__(self, config=None):
        # With the run's config, sampled rollouts carry its feedback.reward_mode (ratings as rewards,
        # group advantages recomputed) as the Postgres buffer's do (not rated_only: that waits for
        # annotators); headless runs have no ratings unless a script writes the 'human' component.
        self.config = config
        self._experiences: list[Experience] = []
        self._status: list[str] = []
        self._keys: set[tuple] = set()
        self.pairs: list[PreferencePair] = []
        self._pair_uses: list[int] = []
        self._lock = threading.Lock()

    def write(self, experiences: Sequence[Experience]) -> int:
        unknown = {exp.source for exp in experiences} - set(SOURCES)
        if unknown:  # refused before anything is stored, as the Postgres buffer's transaction does
            raise ValueError(f"unknown experience source(s) {sorted(unknown)}")
        written = 0
        with self._lock:
            added = set()
            for exp in experiences:
                if exp.source == "rollout":
                    if exp.key in self._keys:
                        continue
                    self._keys.add(exp.key)
                    added.add(exp.key)
                elif exp.promoted_from in self._keys and exp.promoted_from not in added:
                    continue  # promoted from a rollout stored before: a replayed step's copy
                self._experiences.append(replace(exp, id=len(self._experiences)))
                self._status.append("ready")
                written += 1
        return written

    def count(self, *, sources: Sequence[str], group_prefix: str = "") -> int:
        with self._lock:
            return sum(exp.source in sources and exp.group_id.startswith(group_prefix) for exp in self._experiences)

    def has_explorer_step(self, step: int) -> bool:
        with self._lock:
            return any(key[0] == step for key in self._keys)

    def sample(self, n: int, *, sources: Sequence[str], min_model_version: int | None = None) -> list[Experience]:
        if self.config is not None and not self.config.feedback.edits_as_expert:
            sources = [s for s in sources if s != "human_edit"]
        newest_first = set(sources) <= set(EXPERT_SOURCES)

        def usable(i: int, exp: Experience) -> bool:
            stale = (
                min_model_version is not None
                and exp.source in self.STALE_SOURCES
                and exp.model_version < min_model_version
            )
            return self._status[i] == "ready" and exp.source in sources and not stale

        with self._lock:
            candidates = [exp for i, exp in enumerate(self._experiences) if usable(i, exp)]
            candidates.sort(key=lambda exp: sample_key(exp, newest_first))
            batch = [replace(exp) for exp in candidates[:n]]
            if self.config is not None and self.config.feedback.reward_mode != "none":
                self._apply_feedback([exp for exp in batch if exp.source in self.STALE_SOURCES])
            return batch

    def sample_mix(self, n: int, n_expert: int, *, min_model_version: int | None = None):
        return (self.sample(n, sources=USUAL_SOURCES, min_model_version=min_model_version),
                self.sample(n_expert, sources=EXPERT_SOURCES))

    def _apply_feedback(self, rollouts: list[Experience]) -> None:
        """As the Postgres buffer's: every group of the batch with a rated member, sampled or not."""
        sampled = {exp.group_id for exp in rollouts}
        members = [exp for exp in self._experiences if exp.group_id in sampled and exp.source in self.STALE_SOURCES]
        rated = {exp.group_id for exp in members if HUMAN_REWARD in exp.reward_components}
        groups = {group_id: [] for group_id in rated}
        for exp in members:
            if exp.group_id in rated:
                groups[exp.group_id].append(replace(exp))
        apply_human_feedback(rollouts, groups, self.config)

    def mark_used(self, *, consumed: Sequence[Experience] = (), reused: Sequence[Experience] = ()) -> None:
        with self._lock:
            for exp in [*consumed, *reused]:
                self._experiences[exp.id].use_count += 1
            for exp in consumed:
                self._status[exp.id] = "consumed"

    def add_pairs(self, pairs: Sequence[PreferencePair]) -> None:
        with self._lock:
            for pair in pairs:
                self.pairs.append(replace(pair, id=len(self.pairs)))
                self._pair_uses.append(0)

    def sample_pairs(self, n: int, *, max_uses: int | None = None) -> list[PreferencePair]:
        with self._lock:
            usable = [i for i in range(len(self.pairs)) if max_uses is None or self._pair_uses[i] < max_uses]
            order = sorted(usable, key=lambda i: (self._pair_uses[i], i))[:n]
            for i in order:
                self._pair_uses[i] += 1
            return [self.pairs[i] for i in order]

    def all(self, status: str | None = None) -> list[Experience]:
        """Everything stored (or with one status), for scripts and tests."""
        with self._lock:
            return [replace(e) for e, s in zip(self._experiences, self._status) if status in (None, s)]


class InMemoryMetrics:
    """Keeps every point; `echo` prints one line per point (the CLI's output)."""

    def __init__(self, echo=None):
        self.points: dict[tuple[str, int], dict] = {}
        self.echo = echo
        self._lock = threading.Lock()

    def log(self, role: str, step: int, values: dict[str, float]) -> None:
        with self._lock:  # whole lines, in the order the points are stored
            self.points[(role, step)] = dict(values)
            if self.echo:
                self.echo(format_metrics(role, step, values))

    def replayed(self, role: str, step: int, model_version: int | None = None) -> None:
        pass  # the point stays; nothing here counts steps

    def series(self, role: str, name: str) -> list[tuple[int, float]]:
        with self._lock:
            return sorted((step, v[name]) for (r, step), v in self.points.items() if r == role and name in v)


class InMemoryCheckpoints:
    """Only the trainer records and forgets checkpoints, in its own thread: no lock."""

    def __init__(self):
        self.records: list[tuple[int, int, str]] = []  # (version, step, path), oldest first

    def record(self, version: int, step: int, path: str) -> None:
        self.records.append((version, step, path))

    def forget(self, checkpoints: Mapping[int, Path]) -> list[int]:
        self.records = [record for record in self.records if record[1] not in checkpoints]
        return list(checkpoints)


def format_metrics(role: str, step: int, values: dict) -> str:
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    return f"{role:8s} step {step:4d}  {shown}"


class InMemoryWeightGroup:
    """protocols.WeightGroup within one process (tests, benchmarks: a trainer and explorers in
    threads): `side(rank)` is the trainer's (0) or an explorer's, all sharing one record of the
    group opened last, as the run's record is shared in Postgres (apps/runs/store.DjangoWeightGroup)."""

    def __init__(self, explorers: int, host: str = "127.0.0.1"):
        self.explorers, self.host = explorers, host
        self.generation, self.address = 0, None
        self.secret = secrets.token_hex(32)
        self._lock = threading.Lock()

    def side(self, rank: int) -> "_WeightGroupSide":
        return _WeightGroupSide(self, rank)


class _WeightGroupSide:
    def __init__(self, record: InMemoryWeightGroup, rank: int):
        self.record, self.rank, self.secret = record, rank, record.secret

    def open(self, port: int) -> tuple[int, str, int, int]:
        record = self.record
        with record._lock:
            record.generation += 1
            record.address = (record.generation, record.host, port, record.explorers)
            return record.address

    def current(self) -> tuple[int, str, int, int] | None:
        return self.record.address

    def close(self, generation: int) -> None:
        record = self.record
        with record._lock:
            if record.address is not None and record.address[0] == generation:
                record.address = None


def memory_stores(config, echo=None) -> Stores:
    """In-memory stores with the config's tasksets (names as memory.load_tasks reads them)."""
    buffer = config.buffer
    return Stores(
        task_source=InMemoryTaskSource.from_spec(buffer.taskset),
        buffer=InMemoryBuffer(config),
        metrics=InMemoryMetrics(echo),
        eval_source=InMemoryTaskSource.from_spec(buffer.eval_taskset) if buffer.eval_taskset else None,
        expert_source=InMemoryTaskSource.from_spec(buffer.expert_taskset) if buffer.expert_taskset else None,
        checkpoints=InMemoryCheckpoints(),
    )
