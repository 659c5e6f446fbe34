"""`shown`: a config value as the run config writes it (config_keys.shown); `data_path`: a model
directory as a user names it."""
from pathlib import Path

from django import template

from ..config_checks import shown as shown_path
from ..config_keys import shown as shown_value

register = template.Library()


@register.filter
def shown(value) -> str:
    return shown_value(value)


@register.filter
def data_path(value) -> str:
    """A model directory the launch stored resolved (/srv/rftweb/data/models/sft-warm) as the user
    named it (models/sft-warm: config_checks.shown); a built-in name as it is."""
    return shown_path(Path(value)) if isinstance(value, str) and value.startswith("/") else value
