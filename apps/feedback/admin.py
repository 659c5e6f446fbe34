from django.contrib import admin

from .models import Feedback


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ("experience", "user", "kind", "value", "updated_at")
    list_filter = ("kind",)
    raw_id_fields = ("experience", "other")
