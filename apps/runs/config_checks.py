"""What a launch checks on top of the engine's config schema (which bounds every value, upper
sanity limits included): model paths, and strings Postgres can store.

A web server shared by a team must not let a config read files outside the data directory: not
through model.path, nor a reward fn's model, nor a buffer rescore's. Problems are reported like the
schema's own errors: a ConfigIssue per dotted key.
"""
import json
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
    hidden = _hidden_size(directories.get("model.path") or _builtin_dir(config.model.path))
    if lora is not None and hidden is not None and lora.r > hidden:
        issues.append(("model.lora.r", f"must be at most the model's hidden size ({hidden}), got {lora.r}"))
    resolved = {key: str(directory) for key, directory in directories.items() if key.startswith("model.")}
    return issues, resolved


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


def _hidden_size(directory: Path | None) -> int | None:
    """config.json's hidden_size, where there is one to read."""
    if directory is None:
        return None
    try:
        model_config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):  # a built-in not built yet
        return None
    size = model_config.get("hidden_size") if isinstance(model_config, dict) else None
    return size if isinstance(size, int) else None


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
