"""A run config's keys by their dotted names ("algorithm.kl.coef"), as the launch form and sweeps set
them, and a value as a person reads it (compare's config diff, sweeps)."""

import json
from collections.abc import Mapping


def get_key(config: Mapping, key: str, default=None):
    for part in key.split("."):
        if not isinstance(config, Mapping) or part not in config:
            return default
        config = config[part]
    return config


def set_key(config: dict, key: str, value) -> None:
    *sections, name = key.split(".")
    for part in sections:
        if not isinstance(config.get(part), dict):
            config[part] = {}
        config = config[part]
    config[name] = value


def shown(value) -> str:
    """A config value as YAML and JSON write it (1e-05, true, null; text as it is), not as Django
    shows a float (0.00001)."""
    return value if isinstance(value, str) else json.dumps(value)
