from django.contrib import admin

from .models import Experience


@admin.register(Experience)
class ExperienceAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "source", "status", "reward", "advantage", "model_version", "explorer_step", "created_at")
    list_filter = ("source", "status", "run")
    search_fields = ("prompt_text", "response_text")
    raw_id_fields = ("run", "task", "parent")
