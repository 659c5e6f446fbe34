"""pydantic's validation errors as the config's issues: each under its dotted key, in our words
(`algorithm.kl.coef: must be >= 0, got -1.0`, `trainr: unknown key; did you mean 'trainer'?`),
and the params a reward fn or pipeline operator declares checked the same way.

pydantic does the checking (types, bounds, choices, unknown and required keys); this module only
names what it found. A value that fails is left out and its default stands in, so the rules across
keys (config_rules) still check the rest: every problem of a config is reported at once.
"""
import difflib
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model
from pydantic_core import PydanticCustomError

from workers.rft.config_text import MAX_REPORTED_ISSUES, TYPE_NAMES, ConfigIssue, type_name
from workers.rft.rewards import REWARD_FNS


# Every section of the config, every params model and every workflow's settings: no unknown keys,
# no coercion ("5" is no integer, 1.0 no int, true no number), no NaN or infinities; a docstring
# under a field is its description (the API schema, the launch form's help, docs/config.md).
class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("config", "must not be empty")
    return text


# A string that says something: blank text (as str.strip() sees it) is refused as "must not be empty".
Text = Annotated[str, StringConstraints(min_length=1), AfterValidator(_not_blank)]
BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
          "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}


@dataclass(frozen=True)
class ModelPath:
    """Marks a field whose value is a model directory that must hold one of these architectures
    (class-name suffixes); a server confines it to its model directories (apps/runs/config_checks)."""
    architectures: tuple[str, ...]


def checked(problem_of) -> AfterValidator:
    """A rule pydantic has no word for: problem_of(value) -> what is wrong, or None."""
    def check(value):
        problem = problem_of(value)
        if problem:
            raise PydanticCustomError("config", "{problem}", {"problem": problem})
        return value
    return AfterValidator(check)


def validate(model: type[BaseModel], data, prefix: str, issues: list[ConfigIssue]) -> tuple[BaseModel | None, set]:
    """(model from data, the dotted keys found bad). Each problem is appended to issues; the
    instance is then made without the bad values (None if even that fails: a required param)."""
    if not isinstance(data, Mapping):
        key = prefix or "<config>"
        issues.append(ConfigIssue(key, f"expected a mapping, got {type_name(data)}"))
        return _or_none(model, {}), {key}
    try:
        return model.model_validate(data), set()
    except ValidationError as err:
        errors = err.errors(include_url=False)
    bad = {}
    for error in sorted(errors, key=lambda error: _rank(model, error["loc"])):
        path, message = _issue(model, error, data, len(issues))
        key = ".".join([prefix, *map(str, path)] if prefix else map(str, path)) or "<config>"
        if key not in bad:  # a union's members each report the one value
            bad[key] = path
            issues.append(ConfigIssue(key, message))
    return _or_none(model, _without(data, bad.values())), set(bad)


def _rank(model, loc) -> list[int]:
    """Where a problem is reported: section by section, its unknown keys first, then its fields
    in their order (pydantic names unknown keys last)."""
    rank, section = [], model
    for part in loc:
        if section is None:
            break
        fields = list(section.model_fields)
        rank.append(fields.index(part) if part in fields else -1)
        section = section_of(section.model_fields[part].annotation) if part in fields else None
    return rank


def _or_none(model, data):
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def _issue(model, error: dict, data, reported: int) -> tuple[list, str]:
    """(path of the key to blame, the message) of one pydantic error: its location walked through
    the models down to the field (what follows is a union member's name or a list's index)."""
    path, value, section, field = [], data, model, None
    for part in error["loc"]:
        if section is None or not isinstance(value, Mapping):
            break
        path.append(part)
        if part not in section.model_fields:
            return path, "unknown key" + unknown_hint(str(part), list(section.model_fields), reported)
        field, value = section.model_fields[part], value.get(part)
        section = section_of(field.annotation)
    return path, _message(error, field, value)


def _message(error: dict, field, value) -> str:
    kind = error["type"]
    types = leaf_types(field.annotation) if field is not None else ()
    if kind == "missing":
        return "required"
    if kind == "model_type":
        return f"expected a mapping, got {type_name(value)}"
    if value is None:
        return "must not be null"
    if kind == "finite_number" or (kind == "float_type" and float in types and type_name(value) == "an integer"):
        return "must be a finite number"  # NaN, an infinity, or an integer past a float's range (10**400)
    if kind.endswith("_type") or (kind == "literal_error" and not isinstance(value, str)):
        return f"expected {expected(types)}, got {type_name(value)}"
    if isinstance(value, str) and not value.strip():
        return "must not be empty"
    if kind == "literal_error":
        options = choices_of(field.annotation)
        return f"'{value}' is not one of: {', '.join(options)}" + hint(value, options)
    if kind == "string_too_long":
        return f"must be at most {error['ctx']['max_length']} characters, got {len(value)}"
    if kind in BOUNDS:
        name, sign = BOUNDS[kind]  # the bound as the field declares it (pydantic's context has 0.0 for gt=0)
        bound = next((getattr(m, name) for m in field.metadata if hasattr(m, name)), error["ctx"][name])
        return f"must be {sign} {bound}, got {float(value) if float in types else value}"
    return error["msg"]


def architectures_of(field) -> tuple[str, ...] | None:
    """The architectures a model-path field's directory may hold (ModelPath); None for other fields."""
    marks = [*field.metadata, *(m for t in get_args(field.annotation) if get_origin(t) is Annotated
                                for m in t.__metadata__)]
    return next((m.architectures for m in marks if isinstance(m, ModelPath)), None)


def section_of(annotation) -> type[BaseModel] | None:
    """The model of a nested section (`kl: KLConfig`, or optional: `lora: LoraConfig | None`)."""
    return next((t for t in _members(annotation) if isinstance(t, type) and issubclass(t, BaseModel)), None)


def _members(annotation) -> tuple:
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if isinstance(annotation, UnionType) or get_origin(annotation) is Union:
        return tuple(t for member in get_args(annotation) for t in _members(member))
    return (annotation,)


def leaf_types(annotation) -> tuple:
    """The Python types a field takes: str for a choice, list for list[str], dict for a section."""
    types = []
    for member in _members(annotation):
        origin = get_origin(member)
        kind = str if origin is Literal else dict if section_of(member) else origin or member
        if kind is not NoneType and kind not in types:
            types.append(kind)
    return tuple(types)


def accepts_null(annotation) -> bool:
    return NoneType in _members(annotation)


def description(field) -> str:
    """A field's description (the docstring under it) on one line."""
    return " ".join((field.description or "").split())


def expected(types) -> str:
    return " or ".join(TYPE_NAMES[t] for t in types)


def choices_of(annotation) -> tuple[str, ...]:
    """The values of a choice field (a Literal, optional or not); () for any other."""
    return next((get_args(t) for t in _members(annotation) if get_origin(t) is Literal), ())


def hint(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_hint(word: str, options: list[str], reported: int, listing: str = "known keys") -> str:
    """The closest of options, else the list of them, for an issue ConfigError will show: past
    MAX_REPORTED_ISSUES none is (10,000 unknown keys cost 0.13 s of difflib, to be dropped)."""
    if reported >= MAX_REPORTED_ISSUES:
        return ""
    return hint(word, options) or f"; {listing}: {', '.join(options) or 'none'}"


def _without(data: Mapping, paths) -> dict:
    """data less the values at paths (copied where it changes)."""
    data = dict(data)
    for path in paths:
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), Mapping):
                break
            node[part] = node = dict(node[part])
        else:
            if path:
                node.pop(path[-1], None)
    return data


# ---- reward fns and pipeline operators -----------------------------------------------------------


def field_of(annotation, default, rules: Mapping) -> tuple:
    """A (type, Field) pydantic takes, from what a reward fn or operator declares of a param: its
    annotation and default (none: required), and rules in pydantic's words (ge, gt, le, lt) or
    ours: choices (the values it takes), check (a function naming a problem), model (the
    architectures a model directory may hold)."""
    kind = Text if annotation is str else (Text | None) if annotation == str | None else annotation
    if "choices" in rules:
        kind = Literal[tuple(rules["choices"])]
    extra = [checked(rules["check"])] if "check" in rules else []
    extra += [ModelPath(tuple(rules["model"]))] if "model" in rules else []
    bounds = {name: rules[name] for name in ("ge", "gt", "le", "lt") if name in rules}
    return Annotated[kind, *extra] if extra else kind, Field(... if default is REQUIRED else default, **bounds)


REQUIRED = inspect.Parameter.empty


@functools.cache
def params_model(fn, weighted: bool = False) -> type[BaseModel]:
    """What a spec may give reward fn, pipeline operator or task selector `fn`: a reward fn's
    weight in the total (weighted; negative: a penalty), then each param after the first two
    ((response, task), (items, ctx), a selector class's (seed, batch_size)), typed by its
    annotation, defaulting to its default, with the rules fn declares."""
    params = list(inspect.signature(fn, eval_str=True).parameters.values())[2:]
    fields = {"weight": (float, Field(1.0))} if weighted else {}
    fields |= {p.name: field_of(p.annotation, p.default, fn.rules.get(p.name, {})) for p in params}
    return create_model(f"{fn.__name__}_params", __base__=Section, **fields)


def reward_fn_issues(spec, key: str = "explorer.reward_fn") -> list[ConfigIssue]:
    """Each problem of a reward fn spec (a name, or {name: weight | {weight: w, <params>}}) under
    its dotted key: unknown fns, and each fn's weight and params held to what the fn declares
    (rewards.base.reward_fn), as config fields are. The spec is a bounded JSON value already."""
    if isinstance(spec, str):
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping) or not spec:
        return [ConfigIssue(key, "expected a reward fn name or a non-empty mapping {name: weight}")]
    issues = []
    for name, value in spec.items():
        at = f"{key}.{name}"
        if name not in REWARD_FNS:
            issues.append(ConfigIssue(at, "unknown reward fn" + unknown_hint(name, REWARD_FNS.names(), len(issues),
                                                                              "known")))
            continue
        params = dict(value) if isinstance(value, Mapping) else {"weight": value}
        validate(params_model(REWARD_FNS.get(name), weighted=True), params, at, issues)
    return issues


def operator_issues(ops: list, registry, key: str) -> list[ConfigIssue]:
    """Each problem of a pipeline (explorer.pipeline: EXPERIENCE_OPERATORS; buffer.task_pipeline:
    TASK_OPERATORS) whose shape passed: unknown operators, at `key[i]` (or `key[i].name`), and
    params held to what the operator declares (pipelines.pipeline_operator) at `key[i].<param>`."""
    issues = []
    for i, spec in enumerate(ops):
        named_spec_issues(spec, registry, f"{key}[{i}]", issues)
    return issues


def named_spec_issues(spec, registry, at: str, issues: list[ConfigIssue]) -> None:
    """The problems of one registered part a config names (a pipeline operator, buffer.task_selector)
    as a name or {name: ..., <params>} whose shape passed, appended to issues: an unknown name at
    `at` (or `at.name`), params held to what the part declares (its signature after its first two
    params, and its rules) at `at.<param>`: an unknown one named with the closest known."""
    params = dict(spec) if isinstance(spec, Mapping) else {"name": spec}
    name = params.pop("name")
    if name not in registry:
        where = f"{at}.name" if isinstance(spec, Mapping) else at
        known = unknown_hint(name, registry.names(), len(issues), "known")
        issues.append(ConfigIssue(where, f"unknown {registry.kind} '{name}'{known}"))
        return
    validate(params_model(registry.get(name)), params, at, issues)
