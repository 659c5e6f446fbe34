"""What a launch checks on top of the engine's config schema (which bounds every value, upper
sanity limits included): model paths, and strings Postgres can store.

A web server shared by a team must not let a config read files outside the data directory.
Problems are reported like the schema's own errors: a ConfigIssue per dotted key.
"""
import json
from pathlib import Path

from django.conf import settings

MODEL_KEYS = ("model.path", "model.ref_path", "model.critic_path")
# A causal language model, as transformers names its classes.
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _value(config, dotted: str):
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def nul_issues(data, prefix: str = "") -> list[tuple[str, str]]:
    """(key, message) for each string holding a NUL character, which Postgres cannot store."""
    if isinstance(data, dict):
        return [
            issue
            for key, value in data.items()
            for issue in nul_issues(value, f"{prefix}.{key}" if prefix else str(key))
        ]
    if isinstance(data, list):
        return [issue for i, value in enumerate(data) for issue in nul_issues(value, f"{prefix}[{i}]")]
    if isinstance(data, str) and "\x00" in data:
        return [(prefix, "must not contain a NUL character (\\x00)")]
    return []


def allowed_model_roots() -> list[Path]:
    """Model directories may lie only under these: the data dir and RFTWEB_MODEL_DIRS."""
    return [Path(settings.DATA_DIR).resolve(), *(Path(d).resolve() for d in settings.RFTWEB_MODEL_DIRS)]


def model_issues(config) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(issues, resolved): each model path is a built-in name or a model directory inside an
    allowed root (relative paths are taken from the data dir; symlinks are resolved first, so a
    link cannot lead out). `resolved` maps each good directory key to its absolute path, which is
    what the run stores, so the workers read exactly what was checked."""
    from workers.rft.models import BUILTIN_MODELS

    issues, resolved = [], {}
    for key in MODEL_KEYS:
        path = _value(config, key)
        if path is None or path in BUILTIN_MODELS:
            continue
        problem, directory = _model_dir_problem(path)
        if problem:
            issues.append((key, problem))
        else:
            resolved[key] = str(directory)
    return issues, resolved


def shown(path: Path) -> str:
    """A path as a user may see it: under the data dir relative to it (the server's own layout
    stays private), under another allowed root as configured (RFTWEB_MODEL_DIRS is the team's)."""
    data_dir = Path(settings.DATA_DIR).resolve()
    return str(path.relative_to(data_dir)) if path.is_relative_to(data_dir) else str(path)


def _model_dir_problem(path: str) -> tuple[str | None, Path | None]:
    roots = allowed_model_roots()
    if "\x00" in path:
        return "must not contain a NUL character", None
    directory = (roots[0] / path).resolve()  # an absolute path replaces the root
    if not any(directory.is_relative_to(root) for root in roots):
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
    architectures = model_config.get("architectures") or []
    if architectures and not any(str(a).endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
        return (
            f"{shown(config_file)} names architecture {', '.join(map(str, architectures))}, which is not a causal "
            "language model (a ...ForCausalLM class)",
            None,
        )
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        return f"{shown(directory)} has no weights ({' or '.join(WEIGHT_FILES)})", None
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        return f"{shown(directory)} has no tokenizer ({' or '.join(TOKENIZER_FILES)})", None
    return None, directory
