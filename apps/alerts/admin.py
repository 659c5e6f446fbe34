from django.contrib import admin

from apps.core.admin_selection import CheckedSelectionMixin

from .models import Alert


@admin.register(Alert)
class AlertAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """What was sent to whom, read-only: a curator sees why a user's alerts fail."""

    list_display = ("created_at", "user", "event", "channel", "status", "attempts", "subject")
    list_filter = ("status", "event", "channel")
    list_select_related = ("user",)
    readonly_fields = [field.name for field in Alert._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
