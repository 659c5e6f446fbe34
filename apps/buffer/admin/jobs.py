"""The jobs that import, export and transform experiences: their progress, result and file. A
pending or running job is cancelled, not deleted (apps.core.job_admin)."""

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from apps.core.admin_selection import CheckedSelectionMixin
from apps.core.job_admin import JobAdminMixin
from apps.core.streaming import file_response

from .. import expert_import, services
from ..models import BufferJob


@admin.register(BufferJob)
class BufferJobAdmin(CheckedSelectionMixin, JobAdminMixin, admin.ModelAdmin):
    list_display = ("id", "kind", "status", "progress", "rows", "what", "created_by", "created_at", "finished_at")
    list_filter = ("kind", "status")
    list_select_related = ("created_by",)
    fields = (
        "kind",
        "status",
        "progress",
        "what",
        "rows",
        "result_summary",
        "error",
        "download",
        "created_by",
        "created_at",
        "started_at",
        "finished_at",
    )
    readonly_fields = fields
    change_form_template = "admin/buffer/bufferjob/change_form.html"

    def get_queryset(self, request):
        return super().get_queryset(request).defer("selection")  # up to 8 bytes a selected row

    def has_add_permission(self, request):
        return False  # jobs are started by the experience actions and the import page

    def has_change_permission(self, request, obj=None):
        return False  # a job is a record: it is looked at, cancelled while it runs, or deleted once finished

    def get_deleted_objects(self, objs, request):
        """Django's list, and a line for each retention archive that stays (its job deleted the rows
        it holds): the page said nothing of it before the delete."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        deleted += [f"Not the retention archive {name}: it stays under the data dir, the only copy of the rows its "
                    "job deleted, and the runs' pages name the file instead of the job"
                    for name in services.kept_archives(objs)]
        return deleted, counts, perms_needed, protected

    def delete_queryset(self, request, queryset):
        kept = services.kept_archives(queryset)
        services.delete_jobs(queryset)
        for name in kept:
            self.message_user(request, f"Kept the retention archive {name} (under the data dir): it is the only "
                                       "copy of the rows its job deleted.", messages.WARNING)

    def delete_model(self, request, obj):
        self.delete_queryset(request, BufferJob.objects.filter(pk=obj.pk))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # The job page follows a running job with the progress widget (static/js/job_progress.js);
        # opened by the export action, it downloads the file once written.
        extra_context = {**(extra_context or {}), "job_label": BufferJob._meta.label_lower}
        extra_context["download_requested"] = bool(request.GET.get("download"))
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="progress")
    def progress(self, job):
        return format_html(
            '<progress data-job-bar max="100" value="{}"></progress> <span data-job-percent>{}</span>%',
            job.percent,
            job.percent,
        )

    @admin.display(description="rows")
    def rows(self, job):
        return format_html("<span data-job-rows>{}</span>", job.rows_text)

    @admin.display(description="what")
    def what(self, job):
        params = job.params
        match job.kind:
            case BufferJob.Kind.IMPORT:
                return f"{job.original_filename} ({params['layout']} layout, {params['format']})"
            case BufferJob.Kind.EXPORT:
                return f"{params['what']} as {params['format']}"
            case BufferJob.Kind.RESCORE:
                return f"with {json.dumps(params['reward_fn'])}"
            case BufferJob.Kind.PIPELINE:
                return f"{params['operator']} {json.dumps(params['params'])}"
            case BufferJob.Kind.RETENTION:
                runs = ", ".join(f"#{run}" for run in params["runs"])
                return f"{params['action']} the buffer of run{'s' * (len(params['runs']) > 1)} {runs}"
        return ""

    @admin.display(description="result")
    def result_summary(self, job):
        result, imported = dict(job.result), []
        if job.kind == BufferJob.Kind.IMPORT and "appended" in result:  # in its file's unit: "imported 5 pairs"
            return str(expert_import.Imported.of_result(result, job.params["layout"]))
        if job.kind == BufferJob.Kind.IMPORT:  # done before imports said whether they added to a dataset
            imported = [f"imported: {expert_import.counted(result.pop(unit), layout)}"
                        for layout, unit in expert_import.IMPORTED_UNIT.items() if unit in result]
        # In a fixed order: Postgres's jsonb keeps keys by length, SQLite as written.
        rest = [f"{key.replace('_', ' ')}: {_value(value)}" for key, value in sorted(result.items())]
        return ", ".join(imported + rest)

    @admin.display(description="file")
    def download(self, job):
        if not job.output:
            return ""
        url = reverse("admin:buffer_bufferjob_download", args=[job.pk])
        return format_html('<a href="{}">{}</a>', url, services.export_filename(job))

    def get_urls(self):
        return [
            path(
                "<int:job_id>/download/",
                self.admin_site.admin_view(self.download_view),
                name="buffer_bufferjob_download",
            ),
            *super().get_urls(),
        ]

    def download_view(self, request, job_id):
        job = get_object_or_404(BufferJob.objects.defer("selection"), pk=job_id)
        if not self.has_view_permission(request, job):
            raise PermissionDenied
        if not job.output:
            raise Http404("this job has no file")
        name = services.export_filename(job)
        # FileResponse guesses the type from the name, and Python's table knows neither .jsonl nor
        # .parquet: it sent application/octet-stream, where the run's feedback download says jsonl.
        content_type = FILE_TYPES.get(name.rsplit(".", 1)[-1])
        return file_response(job.output.open("rb"), as_attachment=True, filename=name, content_type=content_type)


FILE_TYPES = {"jsonl": "application/jsonl", "parquet": "application/vnd.apache.parquet"}


def _value(value) -> str:
    """A value of a job's result in words: counts with thousands separators, a retention job's
    counts by run ({"12": 10000}) as "#12 10,000"."""
    if isinstance(value, dict):
        return "; ".join(f"#{key} {_value(count)}" for key, count in value.items()) or "none"
    return f"{value:,}" if isinstance(value, int) else str(value)
