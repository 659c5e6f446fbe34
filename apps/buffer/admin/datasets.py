"""The expert datasets: what was imported under each name, its rows and the runs that name it.
Imports make them (the experiences page's Import expert data); here a curator looks and deletes."""

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html

from apps.core.admin_selection import CheckedSelectionMixin
from apps.feedback.models import Feedback

from .. import expert_import, services
from ..models import Experience, ExpertDataset

RUNS_SHOWN = 5  # a row names this many of the runs that name its dataset, then how many more


@admin.register(ExpertDataset)
class ExpertDatasetAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    list_display = ("name", "layout", "rows", "runs", "created_by", "created_at")
    list_filter = ("layout",)
    list_select_related = ("created_by",)
    search_fields = ("name",)
    fields = ("name", "layout", "rows", "runs", "created_by", "created_at")
    readonly_fields = fields

    def get_queryset(self, request):
        # A DPO dataset's pairs are the preferences between its rows (what a run trains on), each
        # two experiences: counted as experiences, 5 pairs read "10".
        # Both counted by a subquery a dataset, never over a join: SQLite ran the pairs' subquery
        # once per joined row of Count("experiences"), and the page of one 200,000-row dataset did
        # not answer in 10 minutes (Postgres: 2.6 s).
        pairs = (
            Feedback.objects.filter(kind=Feedback.Kind.PREFERENCE, value=1.0, experience__dataset=OuterRef("pk"))
            .order_by().values("experience__dataset").annotate(count=Count("pk")).values("count")
        )
        rows = (Experience.objects.filter(dataset=OuterRef("pk")).order_by().values("dataset")
                .annotate(count=Count("pk")).values("count"))
        return super().get_queryset(request).annotate(
            row_count=Coalesce(Subquery(rows, output_field=IntegerField()), 0),
            pair_count=Coalesce(Subquery(pairs, output_field=IntegerField()), 0),
        )

    def has_add_permission(self, request):
        return False  # an import makes a dataset: Experiences, Import expert data

    def has_change_permission(self, request, obj=None):
        return False  # runs name it: renamed, they would train on nothing

    @admin.display(description="size", ordering="row_count")
    def rows(self, dataset):
        """What its files held: SFT rows, or DPO pairs (links to their experiences, two a pair)."""
        url = reverse("admin:buffer_experience_changelist") + f"?dataset__id__exact={dataset.pk}"
        count = dataset.pair_count if dataset.layout == ExpertDataset.Layout.DPO else dataset.row_count
        return format_html('<a href="{}">{}</a>', url, expert_import.counted(count, dataset.layout))

    @admin.display(description="runs that name it")
    def runs(self, dataset):
        newest, named = dataset.named_by
        links = [format_html('<a href="{}">{}</a>', reverse("run-detail", args=[pk]), name) for pk, name in newest]
        more = named - len(links)
        return format_html(", ".join(["{}"] * len(links)) + (f" and {more} more" if more > 0 else ""), *links) or "—"

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        self._read_runs(changelist.result_list)  # the page's rows, kept by its queryset for the template
        return changelist

    def get_object(self, request, object_id, from_field=None):
        dataset = super().get_object(request, object_id, from_field)
        if dataset is not None:
            self._read_runs([dataset])
        return dataset

    def _read_runs(self, datasets):
        """Each dataset's `named_by` (what `runs` shows), for all of them in one query."""
        named = services.runs_naming([dataset.name for dataset in datasets], newest=RUNS_SHOWN)
        for dataset in datasets:
            dataset.named_by = named.get(dataset.name, ([], 0))

    def get_deleted_objects(self, objs, request):
        """Each dataset with a count of its rows (Django's page listed every experience, a million),
        and as protected the runs that may still have to copy one (services.runs_waiting_for): the
        page then deletes nothing."""
        deleted = [f"{dataset.name}: {dataset.experiences.count():,} experiences and the preferences between them"
                   for dataset in objs]
        waiting = [f"Run {run.name} (#{run.pk}) {services.still_needs(run)}"
                   for run in services.runs_waiting_for(dataset.name for dataset in objs)]
        return deleted, {"expert datasets": len(deleted)}, set(), waiting

    def delete_model(self, request, obj):
        self.delete_queryset(request, ExpertDataset.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        try:
            rows = services.delete_datasets(queryset)
        except services.DatasetInUse as refused:  # a run launched since the confirmation page
            self.message_user(request, str(refused), messages.ERROR)
            return
        self.message_user(request, f"{rows:,} experiences deleted with them; the runs' copies stay.", messages.INFO)
