from django.contrib import admin
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from apps.buffer import expert_import
from apps.buffer.admin import ExportActionForm, export_action
from apps.core.admin_selection import CheckedSelectionMixin
from apps.core.counts import EstimatedCountPaginator

from .models import Feedback


class DpoPairFilter(admin.SimpleListFilter):
    """Preferences that say `experience` beat `other` (value 1; older rows have no value): what
    DPO trains on, and what a DPO export file holds."""

    title = "DPO pair"
    parameter_name = "dpo_pair"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        pair = Q(kind=Feedback.Kind.PREFERENCE) & (Q(value=1.0) | Q(value__isnull=True))
        if self.value() == "yes":
            return queryset.filter(pair)
        if self.value() == "no":
            return queryset.exclude(pair)
        return queryset


@admin.register(Feedback)
class FeedbackAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """Judgements to look at and export. They change only through their services (annotating,
    undo, review: apps/feedback), which keep what training reads in step: the experience's human
    reward, a flag's rejection, an edit's row. The admin's plain delete or save left a deleted
    rating training and a changed one unread; a curator rejects a judgement in Review."""

    def get_queryset(self, request):
        # An imported DPO pair's preference shows with its rows, once their import has finished.
        return super().get_queryset(request).exclude(expert_import.staged("experience__"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    list_display = (
        "id",
        "experience_link",
        "kind",
        "user",
        "value",
        "label",
        "other_link",
        "short_comment",
        "seconds_spent",
        "updated_at",
    )
    list_filter = ("kind", DpoPairFilter, "user")
    search_fields = ("comment", "edited_text", "user__username")
    list_select_related = ("user",)
    raw_id_fields = ("experience", "other")
    ordering = ("-id",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    action_form = ExportActionForm
    actions = ("export_selection",)

    # Experiences are shown as links by id: their rows (texts, token arrays) are never loaded.
    @admin.display(description="experience", ordering="experience")
    def experience_link(self, feedback):
        return _experience_link(feedback.experience_id)

    @admin.display(description="other")
    def other_link(self, feedback):
        return _experience_link(feedback.other_id) if feedback.other_id else ""

    @admin.display(description="comment")
    def short_comment(self, feedback):
        return Truncator(feedback.comment).chars(80)

    @admin.action(description="Export selected feedback", permissions=["view"])
    def export_selection(self, request, queryset):
        return export_action(self, request, queryset)


def _experience_link(experience_id: int):
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:buffer_experience_change", args=[experience_id]), experience_id
    )
