"""What a launch checks on top of the engine's config schema (which bounds every value, upper
sanity limits included): model paths, strings Postgres can store, source runs; whether the run
fits the machines that would serve it is config_fit.py's.

A web server shared by a team must not let a config read files outside the data directory: not
through model.path, nor a reward fn's model, nor a buffer rescore's. Problems are reported like
the schema's own errors: a ConfigIssue per dotted key.
"""
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import Count, Q

from apps.buffer.models import ExpertDataset, expert_copies
from apps.saved_models.directories import missing as missing_saved_model
from workers.rft.algorithms import resolve
from workers.rft.config import (
    ConfigError,
    ConfigIssue,
    check_config_value,
    model_paths,
    reward_fn_issues,
    reward_model_paths,
)
from workers.rft.config_rules import data_sources, samples_expert

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
    policy_dir = directories.get("model.path") or builtin_dir(config.model.path)
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
        issues += _context_issues(config, model_config(policy_dir).get("max_position_embeddings"))
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


def source_run_warnings(config) -> list[str]:
    """A launch's word on the feedback.source_runs (RunConfig `config`) that have given nothing yet
    of what this run takes from them: preference pairs for dpo (store.judged_pairs, under this
    run's exclude_flagged, as its sample_pairs asks), ready human edits for sft and mix (store's
    _sampleable). A run on them alone launched without a word and then waited; a warning, not a
    refusal: annotators may judge those runs at any time, and the trainer waits for it, saying so."""
    from apps.buffer.models import Experience
    from apps.buffer.store import judged_pairs
    from apps.runs.models import Run

    spec, feedback = resolve(config), config.feedback
    pairs = spec.sample_strategy == "pairs"
    if not feedback.source_runs or config.mode not in ("both", "train") or not (pairs or samples_expert(spec)):
        return []
    if pairs:
        unflagged = ", neither response flagged" if feedback.exclude_flagged else ""
        what, one = f"no preference pairs yet (comparisons with a verdict{unflagged})", "pair"
        given = set(judged_pairs(feedback.source_runs, exclude_flagged=feedback.exclude_flagged)
                    .values_list("experience__run", flat=True))
    else:
        what, one = "no human edits ready yet", "edit"
        given = set(Experience.objects.filter(run__in=feedback.source_runs, source=Experience.Source.HUMAN_EDIT,
                                              status=Experience.Status.READY).values_list("run", flat=True))
    names = dict(Run.objects.filter(pk__in=feedback.source_runs).values_list("pk", "name"))
    waiting = _waiting_for_review(feedback.source_runs, pairs)
    empty = [f"run {run_id} ({names[run_id]!r}{waiting.get(run_id, '')})" for run_id in feedback.source_runs
             if run_id not in given and run_id in names]
    if not empty:
        return []
    # What could feed it at once: data_sources less what people have yet to judge (the source runs,
    # and in mode both this run's own answers, which do not exist before it starts).
    judged = ("human edits on run", "annotators' comparisons on run", "annotators' edits of this run",
              "annotators' comparisons of this run")
    at_once = [source for source in data_sources(config, web=True) if not source.startswith(judged)]
    plural = len(empty) > 1
    said = f"feedback.source_runs: {', '.join(empty)} {'have' if plural else 'has'} {what}"
    if len(empty) < len(names):
        return [f"{said}: this run trains on what the other source runs have meanwhile."]
    if at_once:
        return [f"{said}: until {'they have' if plural else 'it has'} some, this run trains on "
                f"{' and '.join(at_once)} alone."]
    own = " or from annotators' judgements of this run's answers" if config.mode == "both" else ""
    return [f"{said}: this run's trainer waits for the first {one} from {'them' if plural else 'it'}{own}, counting "
            "no step, and its duty line says so."]


def _waiting_for_review(run_ids, pairs: bool) -> dict[int, str]:
    """Of the source runs that require review, what their reviewers have yet to accept of what this
    run takes (verdicts, or edits), as said after a run's name: ", 3 comparisons waiting for a
    reviewer". Accepted, they train; said, so the researcher knows whom to ask."""
    from apps.feedback.models import Feedback

    kind = Feedback.Kind.PREFERENCE if pairs else Feedback.Kind.EDIT
    pending = Feedback.objects.filter(experience__run_id__in=run_ids, kind=kind, review=Feedback.Review.PENDING)
    if pairs:
        pending = pending.filter(Q(value=1.0) | Q(value__isnull=True))  # a verdict; a tie is no pair
    one = "comparison" if pairs else "edit"
    return {run_id: f", {n} {one}{'s' if n > 1 else ''} waiting for a reviewer"
            for run_id, n in pending.values_list("experience__run_id").annotate(n=Count("pk"))}


def expert_dataset_issue(config) -> ConfigIssue | None:
    """buffer.expert_dataset must name an imported dataset this algorithm reads: an SFT one for
    the algorithms that imitate (sft, mix, mix_chord), a DPO one for dpo's pairs."""
    name = config.buffer.expert_dataset
    if name is None:
        return None
    layout = ExpertDataset.objects.filter(name=name).values_list("layout", flat=True).first()
    if layout is None:
        return ConfigIssue("buffer.expert_dataset", f"no expert dataset named {name!r}: curators import one on the "
                           "experiences page (Import expert data), under the name a run gives here")
    pairs = resolve(config).sample_strategy == "pairs"
    if pairs != (layout == ExpertDataset.Layout.DPO):
        wants, use = ("preference pairs", "a DPO dataset") if pairs else ("responses to imitate", "an SFT dataset")
        return ConfigIssue("buffer.expert_dataset", f"{name!r} holds {layout.upper()} data, and algorithm "
                           f"'{config.algorithm.name}' trains on {wants}: name {use}")
    return None


def expert_dataset_gone(run) -> str | None:
    """Why a stopped or failed run cannot resume for its expert dataset: deleted before its trainer
    copied it (expert_data.seed: a copy made is the run's). Each Resume had queued, then failed."""
    name = (run.config.get("buffer") or {}).get("expert_dataset")
    if not name or ExpertDataset.objects.filter(name=name).exists():
        return None
    if expert_copies(run).exists():
        return None
    return (f"buffer.expert_dataset: no expert dataset is named {name!r} and the run had not copied it yet: "
            "import it again under that name")


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

    directory = builtin_dir(path) if path in BUILTIN_MODELS else Path(path)
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


def builtin_dir(path: str) -> Path | None:
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
    if not model_config(directory):
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
    size = model_config(directory).get("hidden_size")
    return size if isinstance(size, int) else None


def model_config(directory: Path | None) -> dict:
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
        return missing_saved_model(str(directory)) or f"no model directory at {shown(directory)}", None
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
