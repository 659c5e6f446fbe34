"""`shown`: a config value as the run config writes it (config_keys.shown)."""
from django import template

from ..config_keys import shown as shown_value

register = template.Library()


@register.filter
def shown(value) -> str:
    return shown_value(value)
