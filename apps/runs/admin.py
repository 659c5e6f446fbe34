from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from apps.core.counts import EstimatedCountPaginator

from .models import Checkpoint, MetricPoint, Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs are launched through the launch checks (services.launch_run), never added here, and
    what workers act on (config, status, where its groups meet, ...) is read-only: a curator's
    edit must not reach a worker unchecked (a rendezvous address made followers join a stranger's
    group; a config edit skipped the model-path confinement). Run.secret is not shown at all."""

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
        "config",
        "mode",
        "status",
        "rendezvous",
        "live_seq",
        "explorer_step",
        "trainer_step",
        "model_version",
        "heartbeats",
        "resumes",
        "created_at",
        "started_at",
        "finished_at",
    )

    def has_add_permission(self, request):
        return False

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
    """Checkpoints are the trainer's record of what it saved: a worker resumes from `path` and
    researchers download it, so nothing here changes them (deleting one is allowed)."""

    list_display = ("run", "version", "step", "path", "created_at")
    list_filter = ("run",)
    list_select_related = ("run",)
    readonly_fields = ("run", "version", "step", "path", "created_at")

    def has_add_permission(self, request):
        return False
