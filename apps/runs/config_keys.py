"""A run config's keys by their dotted names ("algorithm.kl.coef"), as the launch form and sweeps set
them, and a value as a person reads it (compare's config diff, sweeps)."""

import json
from collections.abc import Mapping

from pydantic import ValidationError

from workers.rft.config import RunConfig
from workers.rft.config_rules import unread_algorithm_keys


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


def reset_unread(config: dict, keys) -> None:
    """Each of `keys` that the config's algorithm would not read goes back to its default, where
    refusing it would refuse what the person did not choose: a field the launch form hides for the
    picked algorithm, a sweep's grpo run from a mix base (mix.mu 0.5). The config's own loss may
    read one (grpo with policy_loss mix reads mix.mu): that one is kept. A config with other errors
    is left as it is, for them to be shown."""
    try:
        parsed = RunConfig.model_validate(config)
    except (ValidationError, ValueError, TypeError):
        return
    defaults = RunConfig().to_dict()
    for unread in unread_algorithm_keys(parsed):  # a key, or a section (algorithm.chord)
        if any(key == unread or key.startswith(unread + ".") for key in keys):
            set_key(config, unread, get_key(defaults, unread))
