from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from apps.core.counts import EstimatedCountPaginator

from .models import Checkpoint, MetricPoint, Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "owner",
        "mode",
        "status",
        "explorer_step",
        "trainer_step",
        "model_version",
        "created_at",
        "experiences",
    )
    list_filter = ("status", "mode")
    search_fields = ("name",)
    list_select_related = ("owner",)
    readonly_fields = (
        "explorer_step",
        "trainer_step",
        "model_version",
        "heartbeats",
        "resumes",
        "created_at",
        "started_at",
        "finished_at",
    )

    @admin.display(description="experiences")
    def experiences(self, run):
        # A link, not a count: counting a run's experiences reads all of them.
        url = reverse("admin:buffer_experience_changelist") + f"?run__id__exact={run.pk}"
        return format_html('<a href="{}">experiences</a>', url)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "role", "step", "time")
    list_filter = ("role", "run")
    list_select_related = ("run",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "version", "step", "path", "created_at")
    list_filter = ("run",)
    list_select_related = ("run",)
