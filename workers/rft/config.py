"""The run config: one schema for the launch form, YAML files and the JSON API.

`RunConfig.from_dict(data)` checks everything and raises one ConfigError listing every problem
under its dotted key (`algorithm.kl.coef: must be >= 0, got -1`). Field rules sit next to the
fields; rules that span several keys are in `_combination_issues`.
"""
import contextlib
import difflib
import functools
import gc
import inspect
import json
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import get_args

import yaml

from workers.rft.algorithms import (
    ADVANTAGE_FNS,
    AGG_MODES,
    ALGORITHMS,
    CORRECTION_MODES,
    EXPERT,
    KL_FNS,
    LOSS_PARTS,
    PAIRS,
    POLICY_LOSSES,
    USUAL,
    resolve,
)
from workers.rft.json_values import json_value_problem
from workers.rft.pipelines import EXPERIENCE_OPERATORS, TASK_OPERATORS
from workers.rft.rewards import CAUSAL_LM, REWARD_FNS
from workers.rft.synchronizer import SPLIT_SYNC_METHODS, SYNC_METHODS
from workers.rft.workflows import WORKFLOWS, workflow_args_problems

MODES = ("both", "explore", "train", "bench")
MAX_ROLLOUTS_PER_STEP = 65_536  # explorer.batch_size * algorithm.repeat_times
MAX_TEXT_CHARS = 100_000
# A whole config, as text or as JSON: real ones are a few KB. Bounded before anything walks it, so
# a small request cannot make a big tree (YAML aliases are refused for the same reason).
MAX_CONFIG_CHARS = 256 * 1024
MAX_CONFIG_DEPTH = 64  # mappings and lists inside each other
# Nodes (mappings, lists, keys and scalars) in a config: a full one has ~110 (RunConfig().to_dict()).
# Reading costs by the node, not the byte: 256 KiB of `[[...]]` are 260,000 nodes, which PyYAML's
# pure-Python reader took 6.5-10 s to read (libyaml with PyYAML's constructor: 1.3 s). YAML's are
# counted in its events before anything is built, JSON's before anything walks them: the most a
# config costs to read and check is this many nodes (~60 ms).
MAX_CONFIG_NODES = 10_000
MAX_PIPELINE_OPERATORS = 32  # each runs on every explorer step; a real pipeline has a few
REQUIRED = object()  # the default of a reward fn parameter without one: the spec must give it


@dataclass
class ConfigIssue:
    key: str  # dotted path, e.g. 'algorithm.kl.coef'; '<config>' for the document itself
    message: str


MAX_REPORTED_ISSUES = 50  # 520 unknown keys in 4 KB of text made a 58 KB error reply


class ConfigError(ValueError):
    def __init__(self, errors: list[ConfigIssue]):
        errors = list(errors)
        if len(errors) > MAX_REPORTED_ISSUES:
            more = len(errors) - MAX_REPORTED_ISSUES
            errors = errors[:MAX_REPORTED_ISSUES] + [ConfigIssue("<config>", f"and {more} more problems")]
        self.errors = errors
        super().__init__("\n".join(f"{issue.key}: {issue.message}" for issue in self.errors))


def _f(default=None, *, factory=None, choices=None, names=None, ge=None, gt=None, le=None, lt=None, most=None,
       check=None, model=None):
    """A config field: its default and the rules its value follows (check(value) -> problem or None).
    `choices`: the values it takes; `names`: the registry whose names a value is made of, where
    the value is more than a choice (a reward fn spec). `most` is a sanity limit rather than a
    range: what one run may ask of shared workers (10^9 new tokens would tie up a GPU for good).
    `model`: the value is a model path, and these are the architectures (class-name suffixes) its
    directory may hold; a server confines it to its model directories (apps/runs/config_checks).
    A reward fn declares its parameters' rules in the same words (rewards.base.reward_fn)."""
    rules = {
        "choices": choices, "names": names, "ge": ge, "gt": gt, "le": le, "lt": lt,
        "most": most, "check": check, "model": model,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=rules)
    return field(default=default, metadata=rules)


def _too_long(text: str, limit: int) -> str | None:
    return f"must be at most {limit} characters, got {len(text)}" if len(text) > limit else None


def _check_operators(ops: list) -> str | None:
    """The shape of a pipeline; operator_issues checks each operator's name and params."""
    if len(ops) > MAX_PIPELINE_OPERATORS:
        return f"at most {MAX_PIPELINE_OPERATORS} operators, got {len(ops)}"
    for i, op in enumerate(ops):
        name = op.get("name") if isinstance(op, Mapping) else op
        if not isinstance(name, str) or not name:
            return f"item {i}: expected an operator name or a mapping with a 'name'"
    return None


def _check_target_modules(value: str | list) -> str | None:
    if isinstance(value, str):
        return None if value == "all-linear" else f"expected 'all-linear' or a list of module names, got '{value}'"
    if not value:
        return "must name at least one module"
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name.strip():
            return f"item {i}: expected a module name (e.g. 'q_proj'), got {name!r}"
    return None


@dataclass
class LoraConfig:
    """Low-rank adapters on the policy (peft): only they train; see docs/scale.md."""
    # Also at most the model's hidden size where the server can read it (apps/runs/config_checks):
    # a larger rank adds memory, not expressiveness.
    r: int = _f(16, ge=1, most=1024)
    alpha: float = _f(32.0, gt=0, most=1e6)  # the update is scaled by alpha / r
    dropout: float = _f(0.0, ge=0, lt=1)
    # Module names (suffixes, as peft matches them: 'q_proj'), or 'all-linear': every linear layer
    # but the output head.
    target_modules: str | list = _f("all-linear", check=_check_target_modules)


@dataclass
class ModelConfig:
    path: str = _f("tiny", model=CAUSAL_LM)  # a local HF dir or a built-in name (resolved by models.py)
    ref_path: str | None = _f(None, model=CAUSAL_LM)  # default: path
    critic_path: str | None = _f(None, model=CAUSAL_LM)  # default: path
    max_prompt_tokens: int = _f(256, ge=1, most=131_072)
    dtype: str = _f("auto", choices=("auto", "float32", "bfloat16", "float16"))
    device: str = _f("auto", choices=("auto", "cpu", "cuda"))
    lora: LoraConfig | None = None  # None: full fine-tuning


@dataclass
class KLConfig:
    fn: str = _f("none", choices=KL_FNS)
    coef: float = _f(0.0, ge=0, most=100.0)


@dataclass
class GAEConfig:
    gamma: float = _f(1.0, ge=0, le=1)  # the discount of GAE and of REINFORCE++'s returns
    lam: float = _f(0.95, ge=0, le=1)


@dataclass
class DPOConfig:
    beta: float = _f(0.1, gt=0, most=100.0)
    label_smoothing: float = _f(0.0, ge=0, lt=0.5)  # conservative DPO: the share of pairs taken as mislabelled


@dataclass
class OPMDConfig:
    tau: float = _f(1.0, gt=0, most=1e6)  # the regularisation towards the current policy; logavgexp's temperature
    baseline: str = _f("mean", choices=("mean", "logavgexp"))


@dataclass
class ChordConfig:
    """mix_chord's SFT weight mu by trainer step: warmup to mu_peak, cosine decay to mu_valley."""

    mu_warmup_steps: int = _f(0, ge=0, most=10_000_000)
    mu_decay_steps: int = _f(0, ge=0, most=10_000_000)
    mu_peak: float = _f(0.1, ge=0, le=1)
    mu_valley: float = _f(0.1, ge=0, le=1)
    enable_phi_function: bool = True  # weight expert tokens by p(1-p) (sft_phi); false: plain NLL


@dataclass
class RolloutCorrectionConfig:
    """Importance weights between the rollout engine's log-probs and the trainer's (correction.py)."""

    mode: str = _f("none", choices=CORRECTION_MODES)
    clip_max: float = _f(3.0, gt=1, most=1e6)
    clip_min: float | None = _f(None, ge=0, lt=1)


@dataclass
class MixConfig:
    mu: float = _f(0.1, ge=0, le=1)
    expert_data_ratio: float = _f(0.25, ge=0, le=1)


@dataclass
class AlgorithmConfig:
    name: str = _f("grpo", choices=ALGORITHMS)
    repeat_times: int = _f(8, ge=1, most=256)
    advantage_fn: str | None = _f(None, choices=ADVANTAGE_FNS)
    policy_loss: str | None = _f(None, choices=POLICY_LOSSES)
    clip_range: float = _f(0.2, gt=0, lt=1)
    clip_range_low: float | None = _f(None, gt=0, le=1)  # 1: no lower bound (CISPO's paper)
    clip_range_high: float | None = _f(None, gt=0, most=100.0)
    # Dual clip (verl, Trinity): a token with a negative advantage costs at most -A * clip_ratio_c,
    # however far its ratio ran; None: no bound (rftweb before 2026-11).
    clip_ratio_c: float | None = _f(3.0, gt=1, most=1e6)
    loss_agg_mode: str = _f("token-mean", choices=AGG_MODES)
    # seq-mean-token-sum-norm's constant divisor; None: explorer.max_new_tokens (Dr. GRPO's budget).
    loss_scale_factor: int | None = _f(None, ge=1, most=10_000_000)
    entropy_coef: float = _f(0.0, ge=0, most=100.0)
    drop_zero_std_groups: bool = False
    epsilon: float = _f(1e-6, gt=0)
    std_normalize: bool = True  # grpo: divide by the group's std (false: Dr. GRPO)
    std_unbiased: bool = True  # grpo: the sample std (n - 1), as verl, Trinity and TRL; false: the population std
    kl: KLConfig = field(default_factory=KLConfig)
    gae: GAEConfig = field(default_factory=GAEConfig)
    value_clip: float = _f(0.2, gt=0)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    mix: MixConfig = field(default_factory=MixConfig)
    opmd: OPMDConfig = field(default_factory=OPMDConfig)
    chord: ChordConfig = field(default_factory=ChordConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    @property
    def clip_low(self) -> float:
        return self.clip_range if self.clip_range_low is None else self.clip_range_low

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high


@dataclass
class ExplorerConfig:
    engine: str = _f("auto", choices=("auto", "vllm", "transformers"))
    # Explorers serving the run, each a worker with its own engine, sharing every step group by
    # group (explorer.py); more than one needs synchronizer.method 'checkpoint'. Each is a duty the
    # watchdog keeps sending until a worker takes it: 256 grew the explore queue without end.
    engine_num: int = _f(1, ge=1, most=32)
    batch_size: int = _f(16, ge=1, most=4096)  # tasks per explorer step
    temperature: float = _f(1.0, ge=0, most=10.0)
    top_p: float = _f(1.0, gt=0, le=1)
    max_new_tokens: int = _f(32, ge=1, most=32_768)
    workflow: str = _f("single_turn", choices=WORKFLOWS)
    # Settings of the workflow named above (multi-turn: environment, turn limit, tools...); each
    # workflow checks its own (workflows.workflow_args_problems).
    workflow_args: dict = _f(factory=dict)
    # a name, or {name: weight | {weight, <params>}}; each fn's params are checked against what it
    # declares (reward_fn_issues)
    reward_fn: str | dict = _f("exact_match", names=REWARD_FNS)
    system_prompt: str | None = _f(None, check=lambda text: _too_long(text, MAX_TEXT_CHARS))
    use_chat_template: bool = True
    pipeline: list = _f(factory=list, check=_check_operators)
    eval_interval: int = _f(0, ge=0, most=10_000_000)  # 0: no eval


@dataclass
class FsdpConfig:
    """trainer.strategy 'fsdp' (torch FSDP2): each rank holds 1/N of every weight, gradient and
    optimizer state; see distributed.py and docs/scale.md."""
    # True (ZeRO-3): a layer's gathered weights are freed after its forward and gathered again for
    # its backward. False (ZeRO-2): kept from forward to backward, one all-gather fewer per layer,
    # at the memory of the whole unsharded model per rank during a micro-batch.
    reshard_after_forward: bool = True
    # The sharded weights, gradients and optimizer state live in CPU memory (the optimizer steps
    # there); each layer's weights are copied to the GPU for its forward and backward.
    cpu_offload: bool = False


@dataclass
class TrainerConfig:
    lr: float = _f(1e-5, gt=0, most=1.0)
    critic_lr: float = _f(1e-5, gt=0, most=1.0)
    batch_size: int | None = _f(None, ge=1, most=65_536)  # default: explorer.batch_size * repeat_times
    micro_batch_size: int = _f(8, ge=1, most=4096)
    # With it, a micro-batch also holds at most this many padded tokens (rows x (longest prompt +
    # longest response)): short answers go many to a micro-batch, long ones few (micro_batches.py).
    micro_batch_tokens: int | None = _f(None, ge=1, most=16_777_216)
    # Keep only each decoder layer's input from the forward and recompute the layer in backward,
    # with any strategy: about a third more compute a step for one layer's activations instead of
    # every layer's, what 1,024-token answers of a 1.5-1.7B model need on one GPU (issue #43).
    activation_checkpointing: bool = False
    total_steps: int = _f(100, ge=1, most=10_000_000)
    # A checkpoint every save_interval steps and whenever save_interval_s seconds have passed since
    # the last one (0 turns either off; one is always saved at the end), so a failure loses minutes,
    # not the run. The newest keep_checkpoints are kept.
    save_interval: int = _f(0, ge=0, most=10_000_000)
    save_interval_s: float = _f(300.0, ge=0, most=1e7)
    keep_checkpoints: int = _f(3, ge=1, most=50)  # each is a whole model with its optimizer state
    grad_clip: float = _f(1.0, gt=0, most=1e6)
    weight_decay: float = _f(0.0, ge=0)
    warmup_steps: int = _f(0, ge=0, most=10_000_000)
    update_epochs: int = _f(1, ge=1, most=100)
    # Data parallelism (names as accelerate's): `ddp` and `fsdp` run num_processes ranks on each of
    # num_nodes machines, each computing on its share of the batch's micro-batches (whole ones: a
    # batch of fewer micro-batches than ranks leaves ranks idle); rank 0 alone talks to storage.
    # `ddp` replicates the models on every rank; `fsdp` shards them (knobs: trainer.fsdp). See
    # distributed.py.
    strategy: str = _f("single", choices=("single", "ddp", "fsdp"))
    # Ranks per node: one per GPU, and a machine has at most 16 (on CPU each rank holds a replica:
    # 64 of SmolLM2 asked for ~30 GB).
    num_processes: int = _f(1, ge=1, most=16)
    # Machines, each a duty that waits for a free train worker of its own.
    num_nodes: int = _f(1, ge=1, most=32)
    # A collective waiting longer than this fails the step, naming the ranks that did not answer.
    collective_timeout_s: float = _f(300.0, gt=0, most=86_400.0)
    fsdp: FsdpConfig | None = None  # None: FSDP's defaults, with strategy 'fsdp'


@dataclass
class BufferConfig:
    taskset: str = "arithmetic"
    expert_taskset: str | None = None
    eval_taskset: str | None = None
    max_staleness: int | None = _f(None, ge=0, most=1_000_000)  # in model versions; None: unbounded
    task_pipeline: list = _f(factory=list, check=_check_operators)


def _check_run_ids(ids: list) -> str | None:
    for i, run_id in enumerate(ids):
        if not isinstance(run_id, int) or isinstance(run_id, bool) or run_id < 1:
            return f"item {i}: expected a run id (a positive integer), got {run_id!r}"
    return None


@dataclass
class FeedbackConfig:
    """How human judgements (apps/feedback) reach training. See docs/feedback.md."""
    # The rating scale: integer points scale_min..scale_max, one digit key each; a rating r is
    # stored normalised, (r - scale_min) / (scale_max - scale_min), in [0, 1].
    scale_min: int = _f(1, ge=0, le=8)
    scale_max: int = _f(5, ge=1, le=9)
    # Annotators who judge each item (more than one measures agreement); None: the deployment's
    # default (RFTWEB_JUDGEMENTS_PER_ITEM).
    judgements_per_item: int | None = _f(None, ge=1, le=20)
    # A rating, edit or comparison reaches training only once a reviewer accepts it (flags act at
    # once: they only keep a row out of training).
    require_review: bool = False
    # none: ratings are only recorded; weight: reward += reward_weight * normalised rating;
    # override: a rated experience's reward is its normalised rating. Group advantages are
    # recomputed from the new rewards.
    reward_mode: str = _f("none", choices=("none", "weight", "override"))
    reward_weight: float = _f(1.0, ge=0)
    # Train only on rated rollouts: the others wait in the buffer until rated (or too stale).
    rated_only: bool = False
    # With rated_only, a trainer step waits up to this many seconds for a full batch of rated rollouts.
    rating_wait_s: float = _f(0.0, ge=0, le=3600)
    edits_as_expert: bool = True  # human edits join the expert data of SFT/MIX
    exclude_flagged: bool = True  # a flagged experience is rejected: never trained on
    # Ids of other runs whose human edits and preference pairs this run also trains on (e.g. a
    # DPO or SFT run in mode 'train' on the feedback collected on an RL run).
    source_runs: list = _f(factory=list, check=_check_run_ids)
    # What annotators should judge by (shown beside every item); None: only the scale's labels.
    rubric: str | None = _f(None, check=lambda text: _too_long(text, MAX_TEXT_CHARS))


@dataclass
class SynchronizerConfig:
    method: str = _f("memory", choices=SYNC_METHODS)
    interval: int = _f(1, ge=1, most=1_000_000)
    offset: int = _f(0, ge=0, most=1_000_000)
    # nccl: how long one transfer (or an explorer's load of it) may take before the trainer names
    # the explorer that did not answer; SmolLM2's takes ~0.3 s on CPU (bench/weight_sync.py).
    timeout_s: float = _f(120.0, ge=1, most=86_400)
    # nccl: checksums on the first version and every verify_every-th after it (0: the first only);
    # they cost ~0.1-0.3 s a side for SmolLM2's 0.5 GB on a loaded 2-core machine.
    verify_every: int = _f(10, ge=0, most=1_000_000)


@dataclass
class RunConfig:
    mode: str = _f("both", choices=MODES)
    seed: int = _f(0, ge=0, most=2**32 - 1)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    explorer: ExplorerConfig = field(default_factory=ExplorerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    synchronizer: SynchronizerConfig = field(default_factory=SynchronizerConfig)
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)

    @classmethod
    def from_dict(cls, data: Mapping) -> "RunConfig":
        check_config_value(data)
        data = _moved_keys(data)
        issues, bad = [], set()
        config = _build(cls, data, "", issues, bad)
        issues += _combination_issues(config, bad)
        if issues:
            raise ConfigError(issues)
        algo = config.algorithm
        if algo.loss_agg_mode == "seq-mean-token-sum-norm" and algo.loss_scale_factor is None:
            algo.loss_scale_factor = config.explorer.max_new_tokens
        return config

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def train_batch_size(self) -> int:
        """Experiences per trainer step: trainer.batch_size, else one explorer step's worth."""
        return self.trainer.batch_size or self.explorer.batch_size * self.algorithm.repeat_times


def _moved_keys(data: Mapping) -> Mapping:
    """A config stored before a key moved (a run resumed or launched again) read with the key where
    it is now: trainer.fsdp.activation_checkpointing is trainer.activation_checkpointing, for every
    strategy (issue #43)."""
    trainer = data.get("trainer")
    fsdp = trainer.get("fsdp") if isinstance(trainer, Mapping) else None
    if not isinstance(fsdp, Mapping) or "activation_checkpointing" not in fsdp:
        return data
    fsdp = dict(fsdp)
    moved = fsdp.pop("activation_checkpointing")
    return {**data, "trainer": {"activation_checkpointing": moved, **trainer, "fsdp": fsdp}}


# libyaml (C) where PyYAML was built with it: its scanner and parser, and PyYAML's own constructor.
_YAML_READER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _Loader(_YAML_READER):
    """YAML 1.1 reads `1e-5` (no dot) as a string; every config author means a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789.")
)
_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
_NODES = (*_OPENS, yaml.ScalarEvent, yaml.AliasEvent)


def _check_yaml_events(text: str) -> None:
    """Reads text's YAML events, building nothing, and stops at the first anchor or alias, at
    nesting deeper than MAX_CONFIG_DEPTH and past MAX_CONFIG_NODES nodes: only text that passes is
    composed (PyYAML recurses, and builds each node in Python). Anchors and aliases (`&a`, `*a`)
    are refused: ten aliases of ten aliases of ... make a few hundred bytes into megabytes, and a
    config never needs them. The pass costs ~1 us a node with libyaml; the pure-Python reader
    (the fallback) stops looking ahead after 1,024 characters, so 50,000 `[` cost it 0.2 s."""
    reader = _Loader(text)
    depth = nodes = 0
    try:
        while reader.check_event():
            event = reader.get_event()
            line = event.start_mark.line + 1
            if getattr(event, "anchor", None) is not None:
                raise _config_error(
                    f"line {line}: YAML anchors and aliases (&{event.anchor}, *{event.anchor}) are not accepted; "
                    "write the value out in full (a config never needs them)")
            depth += isinstance(event, _OPENS) - isinstance(event, _CLOSES)
            if depth > MAX_CONFIG_DEPTH:
                raise _config_error(f"line {line}: nested more than {MAX_CONFIG_DEPTH} levels deep")
            nodes += isinstance(event, _NODES)
            if nodes > MAX_CONFIG_NODES:
                raise _too_many_nodes(f"line {line}: ")
    finally:
        reader.dispose()


def _config_error(message: str) -> ConfigError:
    return ConfigError([ConfigIssue("<config>", message)])


def _too_many_nodes(where: str = "") -> ConfigError:
    return _config_error(f"{where}more than {MAX_CONFIG_NODES} nodes (mappings, lists, keys and scalars); "
                         "a full config has about 110")


def parse_config_text(text: str) -> dict:
    """YAML or JSON text to a config mapping, the one reader of config text wherever it comes from
    (a file, the API, the launch form's YAML box, its hidden `base` field and reward_fn field, a
    buffer rescore): not yet validated against the schema, but a bounded JSON value
    (check_config_value), so safe to render, dump or store. Syntax errors, text longer than
    MAX_CONFIG_CHARS, nesting deeper than MAX_CONFIG_DEPTH, more than MAX_CONFIG_NODES nodes and
    YAML aliases are ConfigErrors."""
    if len(text) > MAX_CONFIG_CHARS:
        raise ConfigError([ConfigIssue("<config>", f"is {len(text)} characters long; at most {MAX_CONFIG_CHARS}")])
    try:
        with _no_cyclic_gc():
            data = _read(text)
    except ConfigError:
        raise
    except (yaml.YAMLError, ValueError) as err:  # ValueError: a date like 2024-02-30, an int of 5,000 digits
        raise ConfigError([ConfigIssue("<config>", f"not valid YAML or JSON: {err}")]) from None
    except RecursionError:  # the depth limit should come first; this is the backstop
        raise ConfigError([ConfigIssue("<config>", f"nested more than {MAX_CONFIG_DEPTH} levels deep")]) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError([ConfigIssue("<config>", f"expected a mapping, got {_type_name(data)}")])
    check_config_value(data)
    return dict(data)


def _read(text: str):
    """A JSON object (the launch form's own field, most scripts) is read as JSON (its C reader builds
    256 KiB of nodes in ~20 ms; check_config_value then counts them). Anything else, or JSON that
    json refuses, as YAML, once its events passed _check_yaml_events."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)  # deep nesting: a RecursionError, like the YAML reader's backstop
        except json.JSONDecodeError:
            pass
    _check_yaml_events(text)
    return yaml.load(text, Loader=_Loader)


@contextlib.contextmanager
def _no_cyclic_gc():
    """Python's cyclic collector paused while config text is read. In a web worker's heap (470,000
    objects) it scanned the half-built value again and again: 0.25 s of the 0.26 s json took for
    87,000 `[]`; and what it found alive mid-read it promoted to the oldest generation, whose full
    collection (0.25 s) then came every fourth read of 10,000 YAML nodes. What a read builds holds
    no cycle; the pause lasts the read (at most ~60 ms); a thread that finds the collector paused
    leaves it to the thread that paused it."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def check_config_value(data) -> None:
    """Raises a ConfigError naming the first part of data that is no bounded JSON value (more than
    MAX_CONFIG_NODES nodes; too deep, too long, a date, NaN, a NUL or a lone surrogate:
    json_values), the check every config passes before anything walks, renders or stores it."""
    if _more_nodes_than(data, MAX_CONFIG_NODES):
        raise _too_many_nodes()
    bad_value = json_value_problem(data, max_depth=MAX_CONFIG_DEPTH, max_chars=MAX_CONFIG_CHARS)
    if bad_value:
        key, message = bad_value
        raise ConfigError([ConfigIssue(key or "<config>", message)])


def _more_nodes_than(data, limit: int) -> bool:
    """Whether data holds more than limit nodes (mappings, lists, keys and scalars), counted as
    _check_yaml_events counts them; the count stops at the limit."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        count += 1 + (len(item) if isinstance(item, Mapping) else 0)  # and its keys
        if count > limit:
            return True
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_reward_fn_text(text: str) -> str | dict:
    """A reward fn spec written by a person (the launch form's field, a buffer rescore): a name, or
    a mapping such as {exact_match: 1, format: 0.2}, read by parse_config_text. Checked by
    reward_fn_issues."""
    text = text.strip()
    return parse_config_text(text) if text.startswith("{") else text


def load_config(source: str | Path) -> RunConfig:
    """A RunConfig from a file (a Path) or from YAML/JSON text (a str: never read as a path, so
    text from a user cannot make us open a file)."""
    text = source.read_text() if isinstance(source, Path) else source
    return RunConfig.from_dict(parse_config_text(text))


# ---- field-level checks -------------------------------------------------------------------------

TYPE_NAMES = {
    bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping",
}
BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}


def _build(cls, data, prefix: str, issues: list, bad: set):
    """An instance of dataclass cls from data; a bad value is reported and its default kept."""
    if not isinstance(data, Mapping):
        _report(issues, bad, prefix or "<config>", f"expected a mapping, got {_type_name(data)}")
        return cls()
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            _report(issues, bad, _join(prefix, key), "unknown key" + _unknown_hint(str(key), known, issues))
    values = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is REQUIRED:
                _report(issues, bad, _join(prefix, f.name), "required")
            continue
        key = _join(prefix, f.name)
        section = _section(f.type)
        if section is not None and not (data[f.name] is None and section is not f.type):
            values[f.name] = _build(section, data[f.name], key, issues, bad)
            continue
        value, problem = _check_value(data[f.name], f)
        if problem:
            _report(issues, bad, key, problem)
        else:
            values[f.name] = value
    return cls(**values)


def _section(type_):
    """The dataclass of a nested section (`kl: KLConfig`, or optional: `lora: LoraConfig | None`)."""
    types = get_args(type_) if isinstance(type_, UnionType) else (type_,)
    return next((t for t in types if is_dataclass(t)), None)


def _check_value(value, f) -> tuple[object, str | None]:
    allowed = get_args(f.type) if isinstance(f.type, UnionType) else (f.type,)
    if value is None:
        return None, None if NoneType in allowed else "must not be null"
    types = [t for t in allowed if t is not NoneType]
    if not any(_is(value, t) for t in types):
        return None, f"expected {' or '.join(TYPE_NAMES[t] for t in types)}, got {_type_name(value)}"
    if float in types:
        value = _finite(value)
        if value is None:
            return None, "must be a finite number"
    if isinstance(value, str) and not value.strip():
        return None, "must not be empty"
    rules = f.metadata
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        return None, f"'{value}' is not one of: {', '.join(choices)}" + _hint(value, list(choices))
    bounds = [(name, rules[name]) for name in BOUNDS if rules.get(name) is not None]
    if not all(BOUNDS[name][0](value, bound) for name, bound in bounds):
        limits = " and ".join(f"{BOUNDS[name][1]} {bound}" for name, bound in bounds)
        return None, f"must be {limits}, got {value}"
    if rules.get("most") is not None and value > rules["most"]:
        return None, f"must be <= {rules['most']}, got {value}"
    check = rules.get("check")
    return value, check(value) if check else None


def _finite(number) -> float | None:
    """number as a float; None for NaN, infinities and integers past a float's range (10**400)."""
    try:
        value = float(number)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _is(value, type_) -> bool:
    if type_ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, type_)


def _type_name(value) -> str:
    return "null" if value is None else next((TYPE_NAMES[t] for t in TYPE_NAMES if _is(value, t)), type(value).__name__)


def _hint(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _unknown_hint(word: str, options: list[str], issues: list, listing: str = "known keys") -> str:
    """The closest of options, else the list of them, for an issue ConfigError will show: past
    MAX_REPORTED_ISSUES none is (10,000 unknown keys cost 0.13 s of difflib, to be dropped)."""
    if len(issues) >= MAX_REPORTED_ISSUES:
        return ""
    return _hint(word, options) or f"; {listing}: {', '.join(options) or 'none'}"


def _join(prefix: str, key) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _report(issues: list, bad: set, key: str, message: str):
    issues.append(ConfigIssue(key, message))
    bad.add(key)


# ---- reward fns and model paths ----------------------------------------------------------------


def reward_fn_issues(spec, key: str = "explorer.reward_fn") -> list[ConfigIssue]:
    """Each problem of a reward fn spec (a name, or {name: weight | {weight: w, <params>}}) under
    its dotted key: unknown fns, and each fn's weight and params held to what the fn declares
    (rewards.base.reward_fn), as config fields are: types, bounds, required and unknown ones. The
    spec is a bounded JSON value already (check_config_value)."""
    if isinstance(spec, str):
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping) or not spec:
        return [ConfigIssue(key, "expected a reward fn name or a non-empty mapping {name: weight}")]
    issues = []
    for name, value in spec.items():
        at = _join(key, name)
        if name not in REWARD_FNS:
            hint = _unknown_hint(name, REWARD_FNS.names(), issues, "known")
            issues.append(ConfigIssue(at, "unknown reward fn" + hint))
            continue
        params = dict(value) if isinstance(value, Mapping) else {"weight": value}
        _build(_params_of(REWARD_FNS.get(name), weighted=True), params, at, issues, set())
    return issues


def operator_issues(ops: list, registry, key: str) -> list[ConfigIssue]:
    """Each problem of a pipeline (explorer.pipeline: EXPERIENCE_OPERATORS; buffer.task_pipeline:
    TASK_OPERATORS) that _check_operators found well formed: unknown operators, at `key[i]` (or
    `key[i].name`), and params held to what the operator declares (pipelines.pipeline_operator)
    at `key[i].<param>`, as reward_fn_issues holds a reward fn's."""
    issues = []
    for i, spec in enumerate(ops):
        params = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
        name = params.pop("name")
        at = f"{key}[{i}]"
        if name not in registry:
            where = f"{at}.name" if isinstance(spec, Mapping) else at
            hint = _unknown_hint(name, registry.names(), issues, "known")
            issues.append(ConfigIssue(where, f"unknown {registry.kind} '{name}'{hint}"))
            continue
        _build(_params_of(registry.get(name)), params, at, issues, set())
    return issues


@functools.cache
def _params_of(fn, weighted: bool = False) -> type:
    """What a spec may give reward fn or pipeline operator `fn` as a dataclass _build checks: a
    reward fn's weight in the total (weighted; negative: a penalty), then each param after the
    first two ((response, task), (items, ctx)), typed by its annotation, defaulting to its default
    (else REQUIRED), with the rules fn declares."""
    params = list(inspect.signature(fn, eval_str=True).parameters.values())[2:]
    weight = [("weight", float, field(default=1.0))] if weighted else []
    return make_dataclass(f"{fn.__name__}_params", [*weight, *(
        (p.name, p.annotation, field(default=REQUIRED if p.default is p.empty else p.default,
                                     metadata=fn.rules.get(p.name, {})))
        for p in params
    )])


def model_paths(config: RunConfig) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{dotted key: (path, architectures its directory may hold)} for every model a run loads:
    the policy, reference and critic, and the reward fns' models."""
    paths = {
        f"model.{f.name}": (getattr(config.model, f.name), f.metadata["model"])
        for f in fields(ModelConfig) if f.metadata.get("model") and getattr(config.model, f.name) is not None
    }
    return paths | reward_model_paths(config.explorer.reward_fn)


def reward_model_paths(spec, key: str = "explorer.reward_fn") -> dict[str, tuple[str, tuple[str, ...]]]:
    """model_paths of a reward fn spec that reward_fn_issues passed."""
    if not isinstance(spec, Mapping):
        return {}  # a bare name: every param at its default, and no model param has one
    return {
        f"{key}.{name}.{param}": (value[param], rules["model"])
        for name, value in spec.items() if isinstance(value, Mapping)
        for param, rules in REWARD_FNS.get(name).rules.items() if "model" in rules and param in value
    }


# ---- rules across keys --------------------------------------------------------------------------


def _loss_fits(loss: str, algorithm: str) -> bool:
    """Whether algorithm.policy_loss `loss` may replace the preset's loss of `algorithm`: it must
    train on the data the algorithm samples (LOSS_PARTS), or on an RL algorithm add expert data to
    the rollouts (mix, mix_chord). The sft losses read no reward: on rollouts they would imitate
    the model's own answers whatever they scored (RL that ignores its rewards), so they are refused
    rather than given that meaning; SFT on expert data is algorithm 'sft'."""
    preset = LOSS_PARTS[ALGORITHMS[algorithm].policy_loss]
    return LOSS_PARTS[loss] == preset or (preset == (USUAL,) and LOSS_PARTS[loss] == (USUAL, EXPERT))


def _loss_misfit(loss: str | None, algorithm: str) -> str:
    preset = ALGORITHMS[algorithm]
    parts = LOSS_PARTS.get(loss)
    if parts == (EXPERT,) and preset.uses_rollouts:
        why = ("it reads no reward, so on rollouts it would imitate the model's own answers "
               "(use algorithm 'sft', or policy_loss 'mix' to add expert data to RL)")
    elif parts == (PAIRS,):
        why = "it trains on preference pairs (use algorithm 'dpo')"
    elif not preset.uses_rollouts:
        why = f"it trains on rollouts, and algorithm '{algorithm}' collects none"
    else:
        why = f"algorithm '{algorithm}' samples expert data, which '{loss}' cannot train on (use algorithm 'grpo')"
    return f"'{loss}' cannot replace the '{preset.policy_loss}' loss of algorithm '{algorithm}': {why}"


def _algorithm_option_rules(algo: AlgorithmConfig, spec) -> list[tuple]:
    """The algorithm's knobs that only some advantage fns or losses read (rules as _combination_issues')."""
    by = ("algorithm.name", "algorithm.advantage_fn", "algorithm.policy_loss")
    loss, adv = spec.policy_loss, spec.advantage_fn
    tau_read = loss == "opmd" or (adv == "opmd" and algo.opmd.baseline == "logavgexp")
    correction = algo.rollout_correction
    return [
        ("algorithm.clip_ratio_c", algo.clip_ratio_c != 3.0 and loss not in ("ppo", "mix", "mix_chord"),
         f"has no effect with policy loss '{loss}': the dual clip bounds the ppo surrogate (ppo, mix, mix_chord)", by),
        ("algorithm.std_normalize", not algo.std_normalize and adv != "grpo",
         f"has no effect with advantage fn '{adv}': it is grpo's (Dr. GRPO)", by),
        ("algorithm.std_unbiased", not algo.std_unbiased and (adv != "grpo" or not algo.std_normalize),
         f"has no effect with advantage fn '{adv}'" + ("" if adv != "grpo" else " and std_normalize false")
         + ": it picks the std grpo divides by", (*by, "algorithm.std_normalize")),
        ("algorithm.loss_scale_factor",
         algo.loss_scale_factor is not None and algo.loss_agg_mode != "seq-mean-token-sum-norm",
         f"has no effect with loss_agg_mode '{algo.loss_agg_mode}': it divides 'seq-mean-token-sum-norm'",
         ("algorithm.loss_agg_mode",)),
        ("algorithm.opmd.baseline", algo.opmd.baseline != "mean" and adv != "opmd",
         f"has no effect with advantage fn '{adv}': it is opmd's", by),
        ("algorithm.opmd.tau", algo.opmd.tau != 1.0 and not tau_read,
         "has no effect here: the opmd loss reads it, and the opmd advantage fn with baseline 'logavgexp'",
         (*by, "algorithm.opmd.baseline")),
        ("algorithm.chord", algo.chord != ChordConfig() and loss != "mix_chord",
         f"has no effect with policy loss '{loss}': it schedules mix_chord's SFT weight", by),
        ("algorithm.dpo.label_smoothing", algo.dpo.label_smoothing > 0 and loss != "dpo",
         f"has no effect with policy loss '{loss}': it is dpo's", by),
        ("algorithm.rollout_correction.mode", correction.mode != "none" and not spec.uses_rollouts,
         f"'{correction.mode}' weights rollouts, and algorithm '{algo.name}' trains on none", by),
        ("algorithm.rollout_correction.clip_max", correction.clip_max != 3.0 and correction.mode == "none",
         "has no effect with rollout_correction.mode 'none'", ("algorithm.rollout_correction.mode",)),
        ("algorithm.rollout_correction.clip_min", correction.clip_min is not None and correction.mode == "none",
         "has no effect with rollout_correction.mode 'none'", ("algorithm.rollout_correction.mode",)),
    ]


def _combination_issues(c: RunConfig, bad: set) -> list[ConfigIssue]:
    """Each rule names the key to blame and the keys it reads; it is skipped when any of them
    already has an error (their values here are defaults standing in for the bad ones).
    A key that would do nothing in its combination is refused too: a run does what its config says.
    (kl.fn with kl.coef 0 is allowed: the KL is then logged, not penalised.)"""
    algo, spec, preset = c.algorithm, resolve(c), ALGORITHMS[c.algorithm.name]
    sync = c.synchronizer
    rules = [  # (key, broken, message, other keys read)
        ("explorer.engine_num",
         c.explorer.engine_num > 1 and (c.mode != "both" or sync.method not in SPLIT_SYNC_METHODS),
         f"{c.explorer.engine_num} explorers run in workers of their own beside the trainer's: set mode 'both' and "
         "synchronizer.method 'checkpoint' or 'nccl'", ("mode", "synchronizer.method")),
        ("synchronizer.method", sync.method == "nccl" and c.mode != "both",
         f"'nccl' sends the trainer's weights to explorers, and mode '{c.mode}' runs "
         f"{'no trainer' if c.mode in ('explore', 'bench') else 'no explorer'}: use 'memory' or 'checkpoint'",
         ("mode",)),
        ("synchronizer.timeout_s", sync.timeout_s != 120.0 and sync.method != "nccl",
         f"has no effect with synchronizer.method '{sync.method}': it bounds an nccl transfer",
         ("synchronizer.method",)),
        ("synchronizer.verify_every", sync.verify_every != 10 and sync.method != "nccl",
         f"has no effect with synchronizer.method '{sync.method}': it checksums nccl transfers",
         ("synchronizer.method",)),
        ("buffer.expert_taskset", spec.sample_strategy == "mix" and c.buffer.expert_taskset is None,
         f"required by {'algorithm' if algo.name == 'mix' else 'policy loss'} 'mix', which mixes expert data into "
         "every trainer batch", ("algorithm.name", "algorithm.policy_loss")),
        ("mode", not spec.uses_rollouts and c.mode == "explore",
         f"'explore' only collects rollouts, and algorithm '{algo.name}' does not train on rollouts",
         ("algorithm.name",)),
        ("algorithm.advantage_fn", algo.advantage_fn is not None and preset.advantage_fn is None,
         f"algorithm '{algo.name}' uses no advantages", ("algorithm.name",)),
        ("algorithm.policy_loss", algo.policy_loss is not None and not _loss_fits(algo.policy_loss, algo.name),
         _loss_misfit(algo.policy_loss, algo.name), ("algorithm.name",)),
        ("algorithm.kl.fn", algo.kl.fn != "none" and not spec.uses_rollouts,
         f"'{algo.kl.fn}' estimates the KL from the policy's own samples (rollouts), and algorithm '{algo.name}' "
         "trains on none", ("algorithm.name",)),
        ("algorithm.kl.coef", algo.kl.coef > 0 and algo.kl.fn == "none",
         "has no effect with algorithm.kl.fn 'none': name an estimator (k1, k2, k3, low_var_kl)", ("algorithm.kl.fn",)),
        *_algorithm_option_rules(algo, spec),
        ("algorithm.entropy_coef", algo.entropy_coef > 0 and spec.policy_loss == "dpo",
         "the 'dpo' loss has no entropy bonus", ("algorithm.name", "algorithm.policy_loss")),
        ("feedback.reward_mode", c.feedback.reward_mode != "none" and not spec.uses_rollouts,
         f"'{c.feedback.reward_mode}' turns ratings into rewards, and algorithm '{algo.name}' trains on no rewards",
         ("algorithm.name",)),
        ("buffer.eval_taskset", c.mode == "bench" and c.buffer.eval_taskset is None,
         "required by mode 'bench'", ("mode",)),
        ("buffer.eval_taskset", c.explorer.eval_interval > 0 and c.buffer.eval_taskset is None,
         "required when explorer.eval_interval > 0", ("explorer.eval_interval",)),
    ]
    trainer = c.trainer
    world = trainer.num_processes * trainer.num_nodes
    rules += [
        ("trainer.num_processes", trainer.strategy == "single" and trainer.num_processes > 1,
         f"strategy 'single' trains in one process, got {trainer.num_processes}: set trainer.strategy 'ddp' "
         "or 'fsdp'", ("trainer.strategy",)),
        ("trainer.num_nodes", trainer.strategy == "single" and trainer.num_nodes > 1,
         f"strategy 'single' trains on one machine, got {trainer.num_nodes}: set trainer.strategy 'ddp' or 'fsdp'",
         ("trainer.strategy",)),
        ("trainer.fsdp", trainer.fsdp is not None and trainer.strategy != "fsdp",
         f"has no effect with trainer.strategy '{trainer.strategy}': its settings are FSDP's (trainer.strategy "
         "'fsdp')", ("trainer.strategy",)),
        ("trainer.fsdp.cpu_offload", trainer.fsdp is not None and trainer.fsdp.cpu_offload and c.model.device == "cpu",
         "has no effect with model.device 'cpu': the weights are in CPU memory already", ("model.device",)),
        # peft's adapters inside FSDP's sharded layers (merging them for the explorer, the
        # base-as-reference switch) are not built; adapters are small, ddp replicates them cheaply.
        ("model.lora", c.model.lora is not None and trainer.strategy == "fsdp",
         "is not available with trainer.strategy 'fsdp' yet: use trainer.strategy 'ddp' with adapters",
         ("trainer.strategy",)),
        ("trainer.strategy", c.trainer.strategy != "single" and world == 1,
         f"'{c.trainer.strategy}' with one rank is 'single': set trainer.num_processes (ranks per node) above 1",
         ("trainer.num_processes", "trainer.num_nodes")),
        ("trainer.strategy", c.trainer.strategy != "single" and c.mode in ("explore", "bench"),
         f"mode '{c.mode}' runs no trainer to spread over ranks", ("mode",)),
        ("model.lora", c.model.lora is not None and c.mode in ("explore", "bench"),
         f"mode '{c.mode}' runs no trainer to put adapters on", ("mode",)),
    ]
    rollouts = c.explorer.batch_size * algo.repeat_times
    rules += [
        ("explorer.batch_size", rollouts > MAX_ROLLOUTS_PER_STEP,
         f"batch_size x algorithm.repeat_times is {rollouts} rollouts a step; at most {MAX_ROLLOUTS_PER_STEP}",
         ("algorithm.repeat_times",)),
        ("feedback.scale_max", c.feedback.scale_max <= c.feedback.scale_min,
         f"must be greater than feedback.scale_min ({c.feedback.scale_min}), got {c.feedback.scale_max}",
         ("feedback.scale_min",)),
    ]
    if "explorer.workflow" not in bad:
        rules += [
            (f"explorer.workflow_args.{key}", True, message, ())
            for key, message in workflow_args_problems(c.explorer.workflow, c.explorer.workflow_args)
        ]
    rules += [
        (issue.key, True, issue.message, ("explorer.reward_fn",)) for issue in reward_fn_issues(c.explorer.reward_fn)
    ]
    rules += [
        (issue.key, True, issue.message, (key,))
        for key, ops, registry in (("explorer.pipeline", c.explorer.pipeline, EXPERIENCE_OPERATORS),
                                   ("buffer.task_pipeline", c.buffer.task_pipeline, TASK_OPERATORS))
        for issue in operator_issues(ops, registry, key)
    ]
    return [
        ConfigIssue(key, message)
        for key, broken, message, reads in rules
        if broken and not any(k == b or k.startswith(b + ".") for k in (key, *reads) for b in bad)
    ]
