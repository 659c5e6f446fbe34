"""Config text: YAML or JSON from a file, the API, the launch form or a buffer rescore, read into a
bounded JSON mapping before anything walks it (size, depth and node limits; no YAML aliases), and
the errors every config check reports (ConfigError: each problem under its dotted key).
"""
import contextlib
import gc
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from workers.rft.json_values import json_value_problem

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


# libyaml (C) where PyYAML was built with it: its scanner and parser, and PyYAML's own constructor.
_YAML_READER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _Loader(_YAML_READER):
    """Numbers by YAML 1.2's rules (below: `010` is 10, `1:30` a string). A key twice in
    one mapping is refused: PyYAML keeps the last, so a second `trainer:` section silently dropped
    the first one's settings."""

    def construct_mapping(self, node, deep=False):
        seen = {}  # a key as written (its tag and text; nothing built twice) -> its line
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                if key in seen:
                    raise _duplicate_key(key_node.value, f"line {line}: ", f" (first on line {seen[key]})")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


# Numbers are read by YAML 1.2's core schema, as most YAML tools now read them (ruamel.yaml, Go's
# yaml.v3, JS yaml), not by PyYAML's YAML 1.1 rules, under which `seed: 010` was 8 (octal) and
# `seed: 1:30` was 90 (base 60) without a word. Under 1.2 a leading zero is decimal (010 is 10, 08
# is 8, where 1.1 made it the string "08"), 0o10 is octal (8; 1.1 read it as the string "0o10"),
# 0x10 is hex (16), and text with a colon is a string: an integer key then refuses it by name
# ("seed: 1:30 ... must be an integer"), a string key keeps it as written. Kept from 1.1, as they
# are never read two ways: a sign before 0x/0o/0b, 0b binary, and `_` between digits (10_000).
# A float needs a dot or an exponent; 1.1 also read `1e-5` (no dot) as a string, where every
# config author means a float.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {  # the 1.1 int and float rules out, the others (bool, null...) kept
    first: [(tag, rule) for tag, rule in rules if tag not in (_INT, _FLOAT)]
    for first, rules in _YAML_READER.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^[-+]?(?:[0-9][0-9_]*|0x_*[0-9a-fA-F][0-9a-fA-F_]*|0o_*[0-7][0-7_]*|0b_*[01][01_]*)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                           |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                           |[-+]?\.(?:inf|Inf|INF)
                           |\.(?:nan|NaN|NAN))$""", re.VERBOSE),
    list("-+0123456789."),
)


def _construct_int(loader, node) -> int:
    """An int as _Loader's resolver reads it: decimal whatever its leading zeros (PyYAML's own made
    010 octal and 1:30 base 60; an explicit `!!int 010` comes here too)."""
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    base = {"0x": 16, "0o": 8, "0b": 2}.get(digits[:2].lower(), 10)
    return sign * int(digits[2:] if base != 10 else digits, base)  # a bad `!!int x`: ValueError, a ConfigError


_Loader.add_constructor(_INT, _construct_int)


class ConfigDumper(yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper):
    """YAML written for _Loader to read back (the launch form's YAML box): a string it would read as
    a number is quoted. PyYAML's own dumper quotes by the 1.1 rules, so it wrote the string "08" or
    "0o10" bare, which _Loader reads as the number 8."""


ConfigDumper.yaml_implicit_resolvers = {first: list(rules) for first, rules in _Loader.yaml_implicit_resolvers.items()}
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


def _duplicate_key(key, where: str = "", first: str = "") -> ConfigError:
    return _config_error(f"{where}key {key!r} appears twice in one mapping{first}; write it once "
                         "(only the last would count)")


def _refuse_duplicates(pairs: list) -> dict:
    """json.loads' object_pairs_hook: json, like PyYAML, keeps a repeated key's last value."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen = set()
        raise _duplicate_key(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return value


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
        raise ConfigError([ConfigIssue("<config>", f"expected a mapping, got {type_name(data)}")])
    check_config_value(data)
    return dict(data)


def _read(text: str):
    """A JSON object (the launch form's own field, most scripts) is read as JSON (its C reader builds
    256 KiB of nodes in ~20 ms; check_config_value then counts them). Anything else, or JSON that
    json refuses, as YAML, once its events passed _check_yaml_events."""
    if text.lstrip().startswith("{"):
        try:
            # Deep nesting: a RecursionError, like the YAML reader's backstop.
            return json.loads(text, object_pairs_hook=_refuse_duplicates)
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


TYPE_NAMES = {
    bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping",
}


def type_name(value) -> str:
    """What a config value is, in words (a bool is a boolean, not an integer)."""
    if value is None:
        return "null"
    return next((name for t, name in TYPE_NAMES.items() if isinstance(value, t)), type(value).__name__)
