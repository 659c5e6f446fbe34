"""The run config: one typed schema (pydantic) for the launch form, YAML files, the JSON API and the
docs' table of keys (docs/config.md, made by `python -m workers.rft.config_docs`).

`RunConfig.from_dict(data)` checks everything and raises one ConfigError listing every problem
under its dotted key (`algorithm.kl.coef: must be >= 0, got -1.0`). Each field's type, bounds and
default sit on the field and the docstring under it is its description; config_issues names what
pydantic found, config_rules holds the rules that span several keys, config_text reads text.
"""
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field

from workers.rft.algorithms import ADVANTAGE_FNS, AGG_MODES, ALGORITHMS, CORRECTION_MODES, KL_FNS, POLICY_LOSSES
from workers.rft.config_issues import (
    ModelPath,
    Section,
    Text,
    architectures_of,
    checked,
    operator_issues,
    reward_fn_issues,
    validate,
)
from workers.rft.config_rules import MAX_ROLLOUTS_PER_STEP, combination_issues
from workers.rft.config_text import (
    MAX_CONFIG_CHARS,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    MAX_REPORTED_ISSUES,
    ConfigError,
    ConfigIssue,
    check_config_value,
    parse_config_text,
    parse_reward_fn_text,
)
from workers.rft.rewards import CAUSAL_LM, REWARD_FNS
from workers.rft.synchronizer import SYNC_METHODS
from workers.rft.workflows import WORKFLOWS

__all__ = [  # what callers import from here, wherever it is defined
    "MAX_CONFIG_CHARS", "MAX_CONFIG_DEPTH", "MAX_CONFIG_NODES", "MAX_PIPELINE_OPERATORS", "MAX_REPORTED_ISSUES",
    "MAX_ROLLOUTS_PER_STEP", "MAX_TEXT_CHARS", "ConfigError", "ConfigIssue", "RunConfig", "check_config_value",
    "load_config", "model_paths", "operator_issues", "parse_config_text", "parse_reward_fn_text", "reward_fn_issues",
    "reward_model_paths",
]

MODES = ("both", "explore", "train", "bench")
MAX_TEXT_CHARS = 100_000
MAX_PIPELINE_OPERATORS = 32  # each runs on every explorer step; a real pipeline has a few
# A pipeline: operator names, or mappings {name: ..., <params>} (config_issues.operator_issues).
OPERATORS = {"items": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["name"]}]}}


def _check_operators(ops: list) -> str | None:
    """The shape of a pipeline; operator_issues checks each operator's name and params."""
    if len(ops) > MAX_PIPELINE_OPERATORS:
        return f"at most {MAX_PIPELINE_OPERATORS} operators, got {len(ops)}"
    for i, op in enumerate(ops):
        name = op.get("name") if isinstance(op, Mapping) else op
        if not isinstance(name, str) or not name:
            return f"item {i}: expected an operator name or a mapping with a 'name'"
    return None


def _check_selector(spec: str | dict) -> str | None:
    """The shape of buffer.task_selector; config_rules checks the name and its params."""
    if isinstance(spec, Mapping) and (not isinstance(spec.get("name"), str) or not spec["name"].strip()):
        return "expected a task selector's name or a mapping with a 'name' (e.g. {name: difficulty_based})"
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


def _check_run_ids(ids: list) -> str | None:
    if set(map(type, ids)) <= {int} and (not ids or min(ids) >= 1):
        return None  # in C: the loop below took 0.57 ms of the largest config's 0.6 ms in pydantic
    for i, run_id in enumerate(ids):
        if not isinstance(run_id, int) or isinstance(run_id, bool) or run_id < 1:
            return f"item {i}: expected a run id (a positive integer), got {run_id!r}"
    return None


Pipeline = Annotated[list, checked(_check_operators), Field(json_schema_extra=OPERATORS)]
Model = Annotated[Text, ModelPath(CAUSAL_LM)]


class LoraConfig(Section):
    """Low-rank adapters on the policy (peft): only they train; see docs/scale.md."""

    r: int = Field(16, ge=1, le=1024)
    """adapter rank (also at most the model's hidden size: more adds memory, not expressiveness)"""
    alpha: float = Field(32.0, gt=0, le=1e6)
    """the update is scaled by alpha / r"""
    dropout: float = Field(0.0, ge=0, lt=1)
    """dropout on the adapters' input"""
    target_modules: Annotated[str | list, checked(_check_target_modules)] = "all-linear"
    """module names as peft matches them (suffixes: 'q_proj'), or 'all-linear': every linear layer but the head"""


class ModelConfig(Section):
    path: Model = "tiny"
    """a built-in model (tiny, smollm2-135m) or a local Hugging Face directory"""
    ref_path: Model | None = None
    """the reference model for the KL; empty: model.path"""
    critic_path: Model | None = None
    """the critic's starting weights (ppo); empty: model.path"""
    max_prompt_tokens: int = Field(256, ge=1, le=131_072)
    """a prompt's last this many tokens are kept"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bfloat16 on a GPU that has it, else float32"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda when there is a GPU"""
    lora: LoraConfig | None = None
    """adapters (docs/scale.md); empty: full fine-tuning"""


class KLConfig(Section):
    fn: Literal[tuple(KL_FNS)] = "none"
    """the KL estimator against the reference model; none: no reference model"""
    coef: float = Field(0.0, ge=0, le=100.0)
    """weight of the KL penalty in the loss (0 with an estimator: logged, not penalised)"""


class GAEConfig(Section):
    gamma: float = Field(1.0, ge=0, le=1)
    """the discount of GAE and of REINFORCE++'s returns"""
    lam: float = Field(0.95, ge=0, le=1)
    """GAE's lambda (ppo)"""


class DPOConfig(Section):
    beta: float = Field(0.1, gt=0, le=100.0)
    """DPO's temperature: how far the policy may move from the reference"""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """conservative DPO: the share of pairs taken as mislabelled"""
    max_pair_uses: int | None = Field(None, ge=1, le=1_000_000)
    """the most trainer steps one preference pair trains in: a step takes only pairs used fewer times, and waits
    while there are none; empty: 1 in mode both (the pairs come as annotators compare the run's answers: each trains
    once, as in online DPO), no limit in mode train (passes over a fixed set, least used first)"""


class OPMDConfig(Section):
    tau: float = Field(1.0, gt=0, le=1e6)
    """the regularisation towards the current policy; logavgexp's temperature"""
    baseline: Literal["mean", "logavgexp"] = "mean"
    """the opmd advantage fn's group baseline"""


class ChordConfig(Section):
    """mix_chord's SFT weight mu by trainer step: warmup to mu_peak, cosine decay to mu_valley."""

    mu_warmup_steps: int = Field(0, ge=0, le=10_000_000)
    """trainer steps of mu's warmup to mu_peak"""
    mu_decay_steps: int = Field(0, ge=0, le=10_000_000)
    """trainer steps of mu's cosine decay to mu_valley"""
    mu_peak: float = Field(0.1, ge=0, le=1)
    """mu after the warmup"""
    mu_valley: float = Field(0.1, ge=0, le=1)
    """mu after the decay"""
    enable_phi_function: bool = True
    """weight expert tokens by p(1-p) (sft_phi); false: plain NLL"""


class RolloutCorrectionConfig(Section):
    """Importance weights between the rollout engine's log-probs and the trainer's (correction.py)."""

    mode: Literal[CORRECTION_MODES] = "none"
    """weight tokens by π_trainer / π_rollout (truncated or masked at clip_max), for engines whose log-probs differ
    from the trainer's (vLLM, bf16)"""
    clip_max: float = Field(3.0, gt=1, le=1e6)
    """the largest weight kept"""
    clip_min: float | None = Field(None, ge=0, lt=1)
    """the smallest weight kept (mask modes); empty: none"""


class MixConfig(Section):
    mu: float = Field(0.1, ge=0, le=1)
    """weight of the SFT loss on expert data"""
    expert_data_ratio: float = Field(0.25, ge=0, le=1)
    """share of expert experiences in each trainer batch (above 0: 0 leaves mu nothing to weigh)"""


class AlgorithmConfig(Section):
    name: Literal[tuple(ALGORITHMS)] = "grpo"
    """the algorithm (docs/algorithms.md): its advantage fn, loss and what it samples"""
    repeat_times: int = Field(8, ge=1, le=256)
    """group size: rollouts per task"""
    advantage_fn: Literal[tuple(ADVANTAGE_FNS)] | None = None
    """empty: the algorithm's own"""
    policy_loss: Literal[tuple(POLICY_LOSSES)] | None = None
    """empty: the algorithm's own; gspo, cispo, opmd on rollouts, sft_is, sft_phi on expert data
    (docs/algorithms.md)"""
    clip_range: float = Field(0.2, gt=0, lt=1)
    """PPO ratio clip ε"""
    clip_range_low: float | None = Field(None, gt=0, le=1)
    """the ratio's lower clip; empty: clip_range (1: no lower bound, CISPO's paper)"""
    clip_range_high: float | None = Field(None, gt=0, le=100.0)
    """the ratio's upper clip; empty: clip_range"""
    clip_ratio_c: float | None = Field(3.0, gt=1, le=1e6)
    """dual clip (verl, Trinity): a token with a negative advantage costs at most this × |A|; empty: off"""
    loss_agg_mode: Literal[AGG_MODES] = "token-mean"
    """how token losses are averaged into one"""
    loss_scale_factor: int | None = Field(None, ge=1, le=10_000_000)
    """seq-mean-token-sum-norm's constant divisor; empty: explorer.max_new_tokens (Dr. GRPO's budget)"""
    entropy_coef: float = Field(0.0, ge=0, le=100.0)
    """weight of the entropy bonus"""
    drop_zero_std_groups: bool = False
    """drop groups whose rewards are all equal (they carry no signal)"""
    epsilon: float = Field(1e-6, gt=0, le=1.0)
    """added to a group's std before dividing by it"""
    std_normalize: bool = True
    """grpo: divide by the group's std (false: Dr. GRPO)"""
    std_unbiased: bool = True
    """grpo: the sample std (n - 1), as verl, Trinity and TRL; false: the population std"""
    kl: KLConfig = Field(default_factory=KLConfig)
    """the KL penalty against the reference model"""
    gae: GAEConfig = Field(default_factory=GAEConfig)
    """generalised advantage estimation (ppo) and REINFORCE++'s discount"""
    value_clip: float = Field(0.2, gt=0, le=1e6)
    """ppo: how far the critic's value may move from the rollout's in one update"""
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    """the dpo loss's settings"""
    mix: MixConfig = Field(default_factory=MixConfig)
    """mix: SFT on expert data beside GRPO on rollouts"""
    opmd: OPMDConfig = Field(default_factory=OPMDConfig)
    """the opmd loss and advantage fn's settings"""
    chord: ChordConfig = Field(default_factory=ChordConfig)
    """mix_chord's schedule of the SFT weight"""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    """importance weights for an engine whose log-probs differ from the trainer's"""

    @property
    def clip_low(self) -> float:
        return self.clip_range if self.clip_range_low is None else self.clip_range_low

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high


class ExplorerConfig(Section):
    engine: Literal["auto", "vllm", "transformers"] = "auto"
    """the rollout engine; auto: vLLM on a GPU where it is installed and serves the model, else transformers"""
    # Each explorer is a duty the watchdog keeps sending until a worker takes it: 256 grew the
    # explore queue without end.
    engine_num: int = Field(1, ge=1, le=32)
    """explorers, each a worker of its own on queue explore sharing every step (checkpoint or nccl sync)"""
    batch_size: int = Field(16, ge=1, le=4096)
    """tasks per explorer step"""
    temperature: float = Field(1.0, ge=0, le=10.0)
    """sampling temperature (0: greedy)"""
    top_p: float = Field(1.0, gt=0, le=1)
    """nucleus sampling's probability mass"""
    max_new_tokens: int = Field(32, ge=1, le=32_768)
    """the longest answer, in tokens"""
    workflow: Literal[tuple(WORKFLOWS)] = "single_turn"
    """how a task is rolled out: one answer, or turns with an environment or tools (docs/agents.md)"""
    workflow_args: dict = Field(default_factory=dict)
    """the workflow's settings (multi-turn: environment, turn limit, tools...); each workflow checks its own"""
    reward_fn: Text | dict = "exact_match"
    """a name, or a mapping of names to weights: {exact_match: 1, format: 0.2}; workflow multi_turn reads none (the
    environment's return is the reward)"""
    system_prompt: Text | None = Field(None, max_length=MAX_TEXT_CHARS)
    """a system message before every prompt; empty: none"""
    use_chat_template: bool = True
    """format prompts with the tokenizer's chat template"""
    pipeline: Pipeline = Field(default_factory=list)
    """operators on each step's experiences before they are stored (docs/data-formats.md)"""
    eval_interval: int = Field(0, ge=0, le=10_000_000)
    """evaluate every N explorer steps; 0: never"""


class FsdpConfig(Section):
    """trainer.strategy 'fsdp' (torch FSDP2): each rank holds 1/N of every weight, gradient and
    optimizer state; see distributed.py and docs/scale.md."""

    reshard_after_forward: bool = True
    """true (ZeRO-3): a layer's weights are gathered again for its backward; false (ZeRO-2): kept, one all-gather
    fewer per layer, at the memory of the whole model per rank"""
    cpu_offload: bool = False
    """the sharded weights, gradients and optimizer state live in CPU memory (the optimizer steps there)"""


class TrainerConfig(Section):
    lr: float = Field(1e-5, gt=0, le=1.0)
    """the policy's learning rate"""
    critic_lr: float = Field(1e-5, gt=0, le=1.0)
    """the critic's learning rate (ppo)"""
    batch_size: int | None = Field(None, ge=1, le=65_536)
    """experiences per step; empty: explorer.batch_size × repeat_times"""
    micro_batch_size: int = Field(8, ge=1, le=4096)
    """rows per forward and backward; gradients accumulate over a step's micro-batches"""
    micro_batch_tokens: int | None = Field(None, ge=1, le=16_777_216)
    """a micro-batch also holds at most this many padded tokens: short answers go many to one, long ones few"""
    activation_checkpointing: bool = False
    """recompute each decoder layer in backward: about a third more compute for one layer's activations instead
    of every layer's (1,024-token answers of a 1.5B model on one GPU)"""
    total_steps: int = Field(100, ge=1, le=10_000_000)
    """trainer steps of the run"""
    save_interval: int = Field(0, ge=0, le=10_000_000)
    """checkpoint every N steps; 0: only at the end (and every save_interval_s)"""
    save_interval_s: float = Field(300.0, ge=0, le=1e7)
    """also checkpoint when this many seconds passed since the last one, so a failure loses minutes; 0: off"""
    keep_checkpoints: int = Field(3, ge=1, le=50)
    """the newest this many are kept: each is a whole model with its optimizer state"""
    grad_clip: float = Field(1.0, gt=0, le=1e6)
    """the gradient's largest norm"""
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    """AdamW's weight decay"""
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    """steps of linear learning-rate warmup"""
    update_epochs: int = Field(1, ge=1, le=100)
    """passes over each batch"""
    strategy: Literal["single", "ddp", "fsdp"] = "single"
    """single: one process · ddp: data parallel, a rank per GPU · fsdp: ddp with the model sharded over the ranks
    (docs/scale.md)"""
    num_processes: int = Field(1, ge=1, le=16)
    """ranks per machine (one per GPU); the trainer's worker starts them"""
    num_nodes: int = Field(1, ge=1, le=32)
    """machines: each past the first needs a free train worker"""
    collective_timeout_s: float = Field(300.0, gt=0, le=86_400.0)
    """a collective waiting longer fails the step, naming the ranks that did not answer"""
    fsdp: FsdpConfig | None = None
    """FSDP's settings (strategy fsdp); empty: its defaults"""


class BufferConfig(Section):
    taskset: Text = "arithmetic"
    """tasks the explorer samples"""
    expert_taskset: Text | None = None
    """expert data: its answers, trained on by sft, mix and mix_chord (dpo trains on preference pairs)"""
    expert_dataset: Text | None = None
    """imported expert data (an expert dataset of the experiences page): sft, mix and mix_chord imitate an SFT
    dataset's responses, dpo trains on a DPO dataset's pairs; copied into the run for its model when its trainer
    starts"""
    eval_taskset: Text | None = None
    """held-out tasks for explorer.eval_interval and mode bench"""
    max_staleness: int | None = Field(None, ge=0, le=1_000_000)
    """oldest model version a trainer batch may use, in versions behind; empty: unbounded"""
    task_pipeline: Pipeline = Field(default_factory=list)
    """operators on the taskset before a step's tasks are selected (docs/task-selection.md)"""
    task_selector: Annotated[Text | dict, checked(_check_selector)] = "default"
    """which tasks each explorer step draws: a selector's name, or {name: ..., <params>}. default: highest priority,
    then least drawn · sequential: the taskset in order · difficulty_based: the tasks whose pass rate, learned from the
    run's own rollouts, is nearest a target (docs/task-selection.md)"""


class FeedbackConfig(Section):
    """How human judgements (apps/feedback) reach training. See docs/feedback.md."""

    scale_min: int = Field(1, ge=0, le=8)
    """the rating scale's lowest point (a rating r is stored as (r - min) / (max - min))"""
    scale_max: int = Field(5, ge=1, le=9)
    """the rating scale's highest point (one digit key each)"""
    judgements_per_item: int | None = Field(None, ge=1, le=20)
    """annotators who judge each item; it trains once all have, with the mean of their ratings or the
    majority of their verdicts (2 or more also measures their agreement); empty: the server's default"""
    require_review: bool = False
    """ratings, edits and comparisons reach training once a reviewer accepts them"""
    reward_mode: Literal["none", "weight", "override"] = "none"
    """none: ratings are recorded · weight: reward += weight × rating · override: the rating is the reward
    (docs/feedback.md)"""
    reward_weight: float = Field(1.0, ge=0, le=1e6)
    """the weight of a rating with reward_mode weight"""
    rated_only: bool = False
    """train only on rated rollouts: the others wait until rated (or too stale)"""
    rating_wait_s: float = Field(0.0, ge=0, le=3600)
    """with rated_only, a trainer step waits up to this long for a full batch of rated rollouts"""
    edits_as_expert: bool = True
    """human edits join the expert data of SFT and MIX"""
    exclude_flagged: bool = True
    """a flagged experience is never trained on"""
    source_runs: Annotated[list, checked(_check_run_ids)] = Field(
        default_factory=list, json_schema_extra={"items": {"type": "integer", "minimum": 1}})
    """other runs whose human edits and preference pairs this run also trains on: runs of this model's tokenizer
    and prompt format (chat template, system prompt)"""
    rubric: Text | None = Field(None, max_length=MAX_TEXT_CHARS)
    """what annotators judge by, shown beside every item; empty: only the scale's labels"""


class SynchronizerConfig(Section):
    method: Literal[SYNC_METHODS] = "memory"
    """memory: explorer and trainer in one worker · checkpoint: through versioned files · nccl: broadcast from the
    trainer to its explorers (gloo on CPU); checkpoint and nccl put them in workers of their own"""
    interval: int = Field(1, ge=1, le=1_000_000)
    """trainer steps between weight syncs"""
    offset: int = Field(0, ge=0, le=1_000_000)
    """explorer runs this many steps ahead of the trainer (1: one-step off-policy)"""
    timeout_s: float = Field(120.0, ge=1, le=86_400)
    """nccl: how long one transfer may take before the trainer names the explorer that did not answer"""
    verify_every: int = Field(10, ge=0, le=1_000_000)
    """nccl: checksums on the first version and every N-th after it (0: the first only)"""


class RunConfig(Section):
    mode: Literal[MODES] = "both"
    """both: explore and train · explore: collect rollouts · train: on the buffer · bench: score model.path"""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """seeds sampling and training"""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """the policy and the models beside it"""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """what the trainer optimises (docs/algorithms.md)"""
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    """how rollouts are made and rewarded"""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """how the policy is trained, on how many ranks"""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """the tasksets a run reads and how stale a batch may be"""
    synchronizer: SynchronizerConfig = Field(default_factory=SynchronizerConfig)
    """how the trainer's weights reach the explorers"""
    feedback: FeedbackConfig = Field(default_factory=FeedbackConfig)
    """how human judgements reach training (docs/feedback.md)"""

    @classmethod
    def from_dict(cls, data: Mapping) -> "RunConfig":
        check_config_value(data)
        issues = []
        config, bad = validate(cls, _moved_keys(data), "", issues)
        issues += combination_issues(config or cls(), bad)
        if issues:
            raise ConfigError(issues)
        return config

    def trained_algorithm(self) -> AlgorithmConfig:
        """The algorithm as the trainer applies it: Dr. GRPO's scale, left empty, is
        explorer.max_new_tokens. Filled here, not in the stored config: a run launched again from a
        stored config kept a scale its user never set, refused with another loss_agg_mode, and stayed
        at the old max_new_tokens when that changed."""
        algo = self.algorithm
        if algo.loss_agg_mode == "seq-mean-token-sum-norm" and algo.loss_scale_factor is None:
            return algo.model_copy(update={"loss_scale_factor": self.explorer.max_new_tokens})
        return algo

    def to_dict(self) -> dict:
        return self.model_dump()

    @property
    def train_batch_size(self) -> int:
        """Experiences per trainer step: trainer.batch_size, else one explorer step's worth."""
        return self.trainer.batch_size or self.explorer.batch_size * self.algorithm.repeat_times


def _moved_keys(data):
    """A config stored before a key moved (a run resumed or launched again) read with the key where
    it is now: trainer.fsdp.activation_checkpointing is trainer.activation_checkpointing, for every
    strategy (issue #43)."""
    trainer = data.get("trainer") if isinstance(data, Mapping) else None
    fsdp = trainer.get("fsdp") if isinstance(trainer, Mapping) else None
    if not isinstance(fsdp, Mapping) or "activation_checkpointing" not in fsdp:
        return data
    fsdp = dict(fsdp)
    moved = fsdp.pop("activation_checkpointing")
    return {**data, "trainer": {"activation_checkpointing": moved, **trainer, "fsdp": fsdp}}


def load_config(source) -> RunConfig:
    """A RunConfig from a file (a Path) or from YAML/JSON text (a str: never read as a path, so
    text from a user cannot make us open a file)."""
    text = source if isinstance(source, str) else source.read_text()
    return RunConfig.from_dict(parse_config_text(text))


def model_paths(config: RunConfig) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{dotted key: (path, architectures its directory may hold)} for every model a run loads:
    the policy, reference and critic, and the reward fns' models."""
    paths = {
        f"model.{name}": (getattr(config.model, name), architectures_of(field))
        for name, field in ModelConfig.model_fields.items()
        if architectures_of(field) and getattr(config.model, name) is not None
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
