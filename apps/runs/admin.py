from django.contrib import admin

from .models import Checkpoint, MetricPoint, Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "mode", "status", "explorer_step", "trainer_step", "model_version", "created_at")
    list_filter = ("status", "mode")
    search_fields = ("name",)
    readonly_fields = ("explorer_step", "trainer_step", "model_version", "heartbeats", "created_at", "started_at", "finished_at")


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "role", "step", "time")
    list_filter = ("role",)


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "version", "step", "path", "created_at")
