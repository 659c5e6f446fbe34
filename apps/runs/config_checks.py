"""What a launch checks on top of the engine's config schema (which bounds every value, upper
sanity limits included): model paths, strings Postgres can store, and whether the run fits the
machines that would serve it.

A web server shared by a team must not let a config read files outside the data directory: not
through model.path, nor a reward fn's model, nor a buffer rescore's. Nor may keys each within its
limit add up to a run no worker can hold: 8 tasks x 16 rollouts x 32,768 new tokens was accepted,
and its pool processes were killed one after the other (`fit`). Problems are reported like the
schema's own errors: a ConfigIssue per dotted key.
"""
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.rft.config import (
    ConfigError,
    ConfigIssue,
    check_config_value,
    model_paths,
    reward_fn_issues,
    reward_model_paths,
)
from workers.rft.footprint import BUILTIN_SHAPES, GB, Footprint, ModelShape, run_footprint
from workers.rft.loop import EXPLORER, TRAINER, components_of
from workers.rft.synchronizer import SPLIT_SYNC_METHODS

from . import hosts
from .hosts import Host

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def allowed_model_roots() -> list[Path]:
    """Model directories may lie only under these: the data dir and RFTWEB_MODEL_DIRS."""
    return [Path(settings.DATA_DIR).resolve(), *(Path(d).resolve() for d in settings.RFTWEB_MODEL_DIRS)]


def model_issues(config) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(issues, resolved) for every model a run loads (config.model_paths: policy, reference,
    critic, reward fns' models): each a built-in name or a model directory inside an allowed root
    (_model_dir_problem); and model.lora.r at most the policy's hidden size where its config.json
    is at hand. The run must store what was checked, so the workers read exactly that: `resolved`
    maps each good model.* key to its absolute directory (the caller sets them), and a reward fn's
    model is set to its directory here, in a copy of the spec."""
    issues, directories = _confined(model_paths(config))
    reward_dirs = {key: directory for key, directory in directories.items() if not key.startswith("model.")}
    config.explorer.reward_fn = _with_models(config.explorer.reward_fn, reward_dirs, "explorer.reward_fn")
    lora = config.model.lora
    policy_dir = directories.get("model.path") or _builtin_dir(config.model.path)
    hidden = _hidden_size(policy_dir)
    if lora is not None and hidden is not None and lora.r > hidden:
        issues.append(("model.lora.r", f"must be at most the model's hidden size ({hidden}), got {lora.r}"))
    if lora is not None and isinstance(lora.target_modules, list) and (names := _linear_names(policy_dir)):
        # peft matches a name or a dotted suffix; a typo validated, then failed the run in peft
        missing = [target for target in lora.target_modules
                   if not any(name == target or name.endswith("." + target) for name in names)]
        if missing:
            named, ends = ", ".join(map(repr, missing)), ", ".join(sorted({name.rsplit(".", 1)[-1] for name in names}))
            issues.append(("model.lora.target_modules",
                           f"no module of the model is named {named}: its linear layers are {ends}"))
    # Not the built-ins: the tiny model's 512 positions (RoPE: longer runs, if into nonsense) would
    # refuse a multi-turn run's default max_tokens, and only once the model had been built.
    if "model.path" in directories:
        issues += _context_issues(config, _model_config(policy_dir).get("max_position_embeddings"))
        if config.explorer.use_chat_template and not _has_chat_template(policy_dir):
            # It failed at the run's first prompt: "Cannot use chat template functions because
            # tokenizer.chat_template is not set".
            issues.append(("explorer.use_chat_template",
                           f"the tokenizer in {shown(policy_dir)} has no chat template (chat_template.jinja, or "
                           "chat_template in tokenizer_config.json): set explorer.use_chat_template false (a "
                           "prompt is then its messages joined by blank lines), or use a model whose tokenizer "
                           "has one"))
    resolved = {key: str(directory) for key, directory in directories.items() if key.startswith("model.")}
    return issues, resolved


def _has_chat_template(directory: Path) -> bool:
    """Whether transformers' tokenizer finds a default chat template in the directory, where it
    looks (tokenization_utils_base.from_pretrained): chat_template.jinja or
    additional_chat_templates/default.jinja, else tokenizer_config.json's chat_template (a text,
    or named templates with a 'default')."""
    if any((directory / name).is_file() for name in ("chat_template.jinja", "additional_chat_templates/default.jinja")):
        return True
    try:
        template = json.loads((directory / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return False
    if isinstance(template, list):
        return any(isinstance(t, dict) and t.get("name") == "default" and t.get("template") for t in template)
    return isinstance(template, str) and bool(template)


# ---- feedback source runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tokenizer:
    vocabulary: str  # a digest of its tokens and their ids
    size: int
    eos: str | None
    chat_template: str | dict | None


def source_run_issues(config, sources) -> list[ConfigIssue]:
    """feedback.source_runs that this run cannot train on as they are: their human edits and
    preference pairs are the token ids of the source run's tokenizer, their prompts formatted by its
    chat template and system prompt. A run on another model's tokenizer had them trained as they
    were (smollm2-135m's 49,152-token vocabulary on a tiny run's 602). `config`: the run's, with
    model.path resolved; `sources`: (id, name, stored config) of each named run."""
    from .config_keys import get_key

    ours = config.explorer
    issues = []
    for run_id, name, stored in sources:
        differences = []
        their_path = get_key(stored, "model.path", "tiny")
        differs = _tokenizer_difference(their_path, config.model.path)
        if differs:
            differences.append(differs)
        their_template = get_key(stored, "explorer.use_chat_template", True)
        if their_template != ours.use_chat_template:
            differences.append(f"its explorer.use_chat_template is {str(their_template).lower()}, this run's "
                               f"{str(ours.use_chat_template).lower()}")
        elif their_template and not differs and _chat_template(their_path) != _chat_template(config.model.path):
            differences.append("its model's chat template is not this model's")
        if (get_key(stored, "explorer.system_prompt", None) or None) != (ours.system_prompt or None):
            differences.append("its explorer.system_prompt is not this run's")
        if differences:
            issues.append(ConfigIssue("feedback.source_runs", f"run {run_id} ({name!r}): {'; '.join(differences)}. "
                                      "Its human edits and preference pairs are token ids of its prompts as it "
                                      "formatted them: name runs of this run's model and prompt format"))
    return issues


def _tokenizer_difference(theirs: str, ours: str) -> str | None:
    """How the tokenizer of model path `theirs` differs from `ours` (None: the same vocabulary)."""
    from workers.rft.models import BUILTIN_MODELS

    if theirs == ours:
        return None
    their_tokenizer, our_tokenizer = _tokenizer(theirs), _tokenizer(ours)
    models = f"its model {_model_name(theirs)!r} and this run's {_model_name(ours)!r}"
    if their_tokenizer is None or our_tokenizer is None:
        if theirs in BUILTIN_MODELS and ours in BUILTIN_MODELS:
            return f"{models} are two models, with two tokenizers"
        return f"{models} differ, and their tokenizers cannot both be read to compare"
    if (their_tokenizer.vocabulary, their_tokenizer.eos) == (our_tokenizer.vocabulary, our_tokenizer.eos):
        return None
    return (f"{models} have two tokenizers (vocabularies of {their_tokenizer.size:,} and {our_tokenizer.size:,} "
            "tokens)")


def _model_name(path: str) -> str:
    from workers.rft.models import BUILTIN_MODELS

    return path if path in BUILTIN_MODELS else shown(Path(path))


def _chat_template(path: str):
    tokenizer = _tokenizer(path)
    return tokenizer.chat_template if tokenizer else None


def _tokenizer(path: str) -> _Tokenizer | None:
    """The tokenizer of a model path (a built-in one once built), None where it cannot be read.
    Read once per process while its files are unchanged (SmolLM2's takes a second)."""
    from workers.rft.models import BUILTIN_MODELS

    directory = _builtin_dir(path) if path in BUILTIN_MODELS else Path(path)
    try:
        stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in directory.iterdir() if f.is_file()))
    except OSError:
        return None
    return _read_tokenizer(str(directory), stamp)


@functools.lru_cache(maxsize=16)
def _read_tokenizer(directory: str, stamp: tuple) -> _Tokenizer | None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception:  # noqa: BLE001 - any tokenizer transformers cannot load here is one we cannot compare
        return None
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return _Tokenizer(hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest(), len(tokenizer),
                      tokenizer.eos_token, tokenizer.chat_template)


def checked_reward_fn(spec, key: str = "reward_fn"):
    """A reward fn spec for work outside a run (a buffer rescore) checked as a launch checks
    explorer.reward_fn: its params (config.reward_fn_issues), then its models confined like
    model.path; returned with them resolved. Raises ConfigError naming each bad key."""
    check_config_value({key: spec})  # a spec from code rather than parse_reward_fn_text: NULs, depth
    issues = reward_fn_issues(spec, key)
    if issues:
        raise ConfigError(issues)
    problems, directories = _confined(reward_model_paths(spec, key))
    if problems:
        raise ConfigError([ConfigIssue(at, message) for at, message in problems])
    return _with_models(spec, directories, key)


def _confined(paths: dict) -> tuple[list[tuple[str, str]], dict[str, Path]]:
    """(issues, {key: directory}) for {key: (path, architectures)}: built-in names pass as they are."""
    from workers.rft.models import BUILTIN_MODELS

    issues, directories = [], {}
    for key, (path, architectures) in paths.items():
        if path in BUILTIN_MODELS:
            continue
        problem, directory = _model_dir_problem(path, architectures)
        if problem:
            issues.append((key, problem))
        else:
            directories[key] = directory
    return issues, directories


def _with_models(spec, directories: dict[str, Path], key: str):
    """The spec with the model param at each dotted key (`<key>.<fn>.<param>`) set to its directory."""
    spec = dict(spec) if directories else spec
    for at, directory in directories.items():
        name, param = at.removeprefix(f"{key}.").split(".")
        spec[name] = {**spec[name], param: str(directory)}
    return spec


def _builtin_dir(path: str) -> Path | None:
    """Where models.resolve_model_path builds a built-in model (it may not be built yet)."""
    from workers.rft.models import BUILTIN_MODELS

    return Path(settings.DATA_DIR).resolve() / "models" / path if path in BUILTIN_MODELS else None


def _context_issues(config, positions) -> list[tuple[str, str]]:
    """A rollout longer than the model's positions: vLLM refuses it when it starts, and a model
    past its positions writes nonsense. Where its config.json says how many it has."""
    from workers.rft.workflows import WORKFLOWS, rollout_tokens

    if not isinstance(positions, int) or config.explorer.workflow not in WORKFLOWS:
        return []
    try:
        context = rollout_tokens(config)
    except ValueError:  # bad workflow_args: reported on their own keys
        return []
    if context <= positions:
        return []
    if context > config.model.max_prompt_tokens + config.explorer.max_new_tokens:
        key, what = "explorer.workflow_args.max_tokens", "explorer.workflow_args.max_tokens"
    else:
        key, what = "explorer.max_new_tokens", "model.max_prompt_tokens + explorer.max_new_tokens"
    return [(key, f"a rollout may hold {context:,} tokens ({what}), past the model's {positions:,} positions "
                  "(max_position_embeddings in its config.json)")]


def _linear_names(directory: Path | None) -> list[str]:
    """The names of the model's linear layers, from its config.json alone (built on the meta device,
    no weights read: ~0.1 s for the tiny model); [] where there is none to read."""
    if not _model_config(directory):
        return []
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build here: the run says so
        return []
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def _hidden_size(directory: Path | None) -> int | None:
    """config.json's hidden_size, where there is one to read."""
    size = _model_config(directory).get("hidden_size")
    return size if isinstance(size, int) else None


def _model_config(directory: Path | None) -> dict:
    """The directory's config.json, or {} (a built-in not built yet)."""
    if directory is None:
        return {}
    try:
        model_config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return model_config if isinstance(model_config, dict) else {}


def shown(path: Path) -> str:
    """A path as a user may see it: under the data dir relative to it (the server's own layout
    stays private), under another allowed root as configured (RFTWEB_MODEL_DIRS is the team's)."""
    data_dir = Path(settings.DATA_DIR).resolve()
    return str(path.relative_to(data_dir)) if path.is_relative_to(data_dir) else str(path)


def _model_dir_problem(path: str, architectures: tuple[str, ...]) -> tuple[str | None, Path | None]:
    """Why path is no model directory of these architectures inside an allowed root (relative
    paths are taken from the data dir; symlinks are resolved first, so a link cannot lead out), or
    (None, its resolved directory). A path outside gets one answer whether or not it exists, so the
    check is no oracle for the server's files."""
    roots = allowed_model_roots()
    try:
        directory = (roots[0] / path).resolve()  # an absolute path replaces the root
    except (OSError, RuntimeError):  # a symlink loop, a name too long: answered as any path outside
        directory = None
    if directory is None or not any(directory.is_relative_to(root) for root in roots):
        others = "".join(f", {root}" for root in roots[1:])
        return (
            f"{path!r} lies outside the allowed model directories (the data directory{others}); "
            "use a built-in model (tiny, smollm2-135m) or a directory under them",
            None,
        )
    if not directory.is_dir():
        return f"no model directory at {shown(directory)}", None
    config_file = directory / "config.json"
    if not config_file.is_file():
        return f"{shown(directory)} has no config.json; is it a Hugging Face model directory (save_pretrained)?", None
    try:
        model_config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{shown(config_file)} is not valid JSON: {err}", None
    if not isinstance(model_config, dict) or not isinstance(model_config.get("model_type"), str):
        return f"{shown(config_file)} has no model_type", None
    named = model_config.get("architectures") or []
    if named and not any(str(a).endswith(architectures) for a in named):
        return (
            f"{shown(config_file)} names architecture {', '.join(map(str, named))}, which is not "
            f"{_what(architectures)}",
            None,
        )
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        return f"{shown(directory)} has no weights ({' or '.join(WEIGHT_FILES)})", None
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        return f"{shown(directory)} has no tokenizer ({' or '.join(TOKENIZER_FILES)})", None
    return None, directory


def _what(architectures: tuple[str, ...]) -> str:
    kinds = ["a causal language model (a ...ForCausalLM class)"]
    if "ForSequenceClassification" in architectures:
        kinds.append("a sequence classifier (...ForSequenceClassification)")
    return " or ".join(kinds)


# ---- will the run fit the machines that would serve it ---------------------------------------------

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
    directory = _builtin_dir(path) if path in BUILTIN_SHAPES else Path(path)
    return ModelShape.from_config(_model_config(directory)) or BUILTIN_SHAPES.get(path)


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
