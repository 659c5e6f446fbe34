"""What every ModelAdmin of the site shares: a bulk action's selection, and a changelist's id
filters, are checked before Django reads them.

A curator's crafted POST of `action=mark_rejected&_selected_action=abc` to the experiences'
changelist was a 500: Django filters `pk__in` with what the checkboxes sent ("Field 'id' expected a
number but got 'abc'"), and an id past a bigint reached the database (SQLite: OverflowError).
`?run=99999999999999999999` on the same list was a 500 on SQLite too (Django guards an integer
field's own `exact`, not a foreign key's).
"""
import re

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import NotRelationField, get_fields_from_path
from django.core.exceptions import FieldDoesNotExist
from django.db import models

from .numbers import MAX_ID, SHOWN_CHARS, whole_number

SHOWN_VALUES = 5


class CheckedSelectionMixin:
    """Mixed into each ModelAdmin, before admin.ModelAdmin (or the ModelAdmin it extends;
    tests/security/test_admin_selection.py checks every registered one): a selection holding a
    value that is no id (every model here has a whole-number key) is refused with a message naming
    it, and nothing is done; the changelist comes back as it was."""

    def response_action(self, request, queryset):
        bad = [value for value in request.POST.getlist(ACTION_CHECKBOX_NAME) if whole_number(value) is None]
        if bad:
            shown = ", ".join(repr(value[:SHOWN_CHARS]) for value in bad[:SHOWN_VALUES])
            self.message_user(request, f"Nothing was done: the selection sent {shown}, which is no "
                                       f"{self.opts.verbose_name} id (a whole number).", messages.ERROR)
            return None  # Django's changelist then redirects to itself, the message shown
        return super().response_action(request, queryset)

    def get_changelist_instance(self, request):
        """A filter of an integer field or a foreign key by a number no 64-bit integer holds is a
        wrong lookup, as `?run=abc` is: the changelist goes back to itself unfiltered (Django's ?e=1)."""
        for name, values in request.GET.lists():
            if _integer_field(self.model, name) and any(_past_a_bigint(value) for value in values):
                raise IncorrectLookupParameters(f"{name}: past the largest id")
        return super().get_changelist_instance(request)


def _integer_field(model, lookup: str) -> bool:
    """Whether the query parameter `lookup` (run, run__id__exact, id__in, ...) filters an integer
    column (a foreign key's is its target's)."""
    parts = lookup.split("__")
    for path in ("__".join(parts), "__".join(parts[:-1])):  # with and without a lookup suffix
        if not path:
            continue
        try:
            field = get_fields_from_path(model, path)[-1]
        except (FieldDoesNotExist, NotRelationField):
            continue
        if field.is_relation:
            field = getattr(field, "target_field", None)
        return isinstance(field, models.IntegerField)
    return False


def _past_a_bigint(value: str) -> bool:
    return any(re.fullmatch(r"\s*-?\d+\s*", part) and abs(int(part)) > MAX_ID for part in value.split(","))
