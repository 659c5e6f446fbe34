"""What every ModelAdmin of the site shares: a bulk action's selection is checked before Django reads it.

A curator's crafted POST of `action=mark_rejected&_selected_action=abc` to the experiences'
changelist was a 500: Django filters `pk__in` with what the checkboxes sent ("Field 'id' expected a
number but got 'abc'"), and an id past a bigint reached the database (SQLite: OverflowError).
"""
from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from .numbers import SHOWN_CHARS, whole_number

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
