"""A run config's keys by their dotted names ("algorithm.kl.coef"), as the launch form and sweeps set
them, and a value as a person reads it (compare's config diff, sweeps)."""

import copy
import json
from collections.abc import Mapping

from pydantic import ValidationError

from workers.rft.config import RunConfig
from workers.rft.config_rules import unread_keys


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


def _within(key: str, section: str) -> bool:
    """key is section, or a key inside it ("explorer.pipeline[0].min" is inside "explorer.pipeline")."""
    return key == section or key.startswith((section + ".", section + "["))


def reset_unread(config: dict, keys, swept=None) -> None:
    """Each of `keys` that the config's combination would not read (config_rules.unread_keys) goes
    back to its default, where refusing it would refuse what the person did not choose: a field the
    launch form hides for the picked algorithm, a key of a sweep's base that a swept value leaves
    unread (a grpo run from a mix base: mix.mu 0.5, buffer.expert_taskset). With `swept`, only the
    keys whose rule reads a swept key, or one reset here: a base key no run reads is the base's own
    mistake, refused. The config's own loss may read one (grpo with policy_loss mix reads mix.mu):
    that one is kept. A config with other errors is left as it is, for them to be shown."""
    changed = None if swept is None else set(swept)
    defaults = RunConfig().to_dict()
    while True:  # a reset may leave another key unread (rated_only, then rating_wait_s)
        try:
            parsed = RunConfig.model_validate(config)
        except (ValidationError, ValueError, TypeError):
            return
        reset = [unread for unread, reads in unread_keys(parsed).items()  # a key, or a section (algorithm.chord)
                 if any(_within(key, unread) for key in keys)
                 and (changed is None or any(_within(r, c) or _within(c, r) for r in reads for c in changed))]
        if not reset:
            return
        for unread in reset:
            set_key(config, unread, get_key(defaults, unread))
        if changed is not None:
            changed.update(reset)
        keys = [key for key in keys if not any(_within(key, unread) for unread in reset)]


def as_run(config: dict) -> dict:
    """A copy of a stored run's config with each key that a rule added since it launched refuses
    as read by nothing back at its default (it did nothing then either): what the run does, for
    its workers (stored_config) and for "Launch again", which was refused naming trainer.lr of a
    mode-explore run launched before that rule. A config with other problems is copied as it is."""
    config = copy.deepcopy(config)
    try:
        reset_unread(config, list(unread_keys(RunConfig.model_validate(config))))
    except (ValidationError, ValueError, TypeError):
        pass  # from_dict names what is wrong
    return config


def stored_config(config: dict) -> RunConfig:
    """A stored run's config as workers and the buffer read it (as_run), so a run launched before a
    rule resumes and trains as it did; a resume used to fail on it, naming the key. Other problems
    raise ConfigError as RunConfig.from_dict's do."""
    return RunConfig.from_dict(as_run(config))
