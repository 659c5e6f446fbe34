from collections import Counter

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import Count, QuerySet
from django.urls import reverse
from django.utils.html import format_html

from apps.core.admin_selection import CheckedSelectionMixin
from apps.core.counts import EstimatedCountPaginator
from apps.core.job_admin import JobAdminMixin
from apps.runs.models import Run

from .models import Task, Taskset, TasksetImport
from .services import name_taken, rename_problem, runs_needing


class TasksetForm(forms.ModelForm):
    class Meta:
        model = Taskset
        fields = "__all__"

    def clean_name(self):
        name = self.cleaned_data["name"]
        problem = rename_problem(self.instance, name) if self.instance.pk is not None else name_taken(name)
        if problem:
            raise forms.ValidationError(problem)
        return name


def readers(tasksets, or_else: str = "") -> list[str]:
    """The runs that may still read one of `tasksets` (runs_needing), each a line of a delete's
    confirmation page that refuses it, saying what lets it go."""
    return [
        f"run {run.pk} '{run.name}' ({run.status}) reads taskset {name}: "
        + ("stop it and delete it first" if run.status in Run.ACTIVE or run.status == Run.Status.QUEUED
           else f"it can be resumed; delete the run first{or_else}")
        for run, name in runs_needing(tasksets)
    ]


@admin.register(Taskset)
class TasksetAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    form = TasksetForm
    list_display = (
        "name",
        "task_count",
        "tasks",
        "default_workflow",
        "default_reward_fn",
        "source",
        "created_by",
        "created_at",
    )
    search_fields = ("name", "description")
    list_select_related = ("created_by",)
    readonly_fields = ("task_count", "created_at")

    @admin.display(description="")
    def tasks(self, taskset):
        url = reverse("admin:tasksets_task_changelist") + f"?taskset__id__exact={taskset.pk}"
        return format_html('<a href="{}">tasks</a>', url)

    def get_deleted_objects(self, objs, request):
        """What the confirmation page lists: each taskset with its count of tasks (Django's own list
        named every task: a 7 MB page, 20 s, for 90,000), and as protected, which refuses the delete,
        the runs that still read one (services.runs_needing)."""
        tasksets = list(objs)
        deleted = [f"Taskset {taskset.name}, with its {taskset.task_count:,} tasks" for taskset in tasksets]
        protected = readers(tasksets)
        counts = {"tasksets": f"{len(tasksets):,}", "tasks": f"{sum(taskset.task_count for taskset in tasksets):,}"}
        return deleted, counts, set(), protected


@admin.register(Task)
class TaskAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    list_display = ("taskset", "index", "short_prompt", "answer", "difficulty", "priority", "run")
    list_filter = ("taskset",)
    search_fields = ("answer",)
    list_select_related = ("taskset", "run")
    raw_id_fields = ("taskset", "run")
    ordering = ("taskset", "index")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def get_queryset(self, request):  # not the tasks of a taskset still being imported (Taskset.ready)
        return super().get_queryset(request).filter(taskset__ready=True)

    def get_deleted_objects(self, objs, request):
        """What the confirmation page lists: the count of tasks a taskset (Django's own list named
        each), and as protected, which refuses the delete, the runs that may still read one of their
        tasksets, as the taskset's own delete refuses (runs_needing). Deleting a held-out set's tasks
        under a training run gave a score of 0.0 at every eval after it; a training set's failed
        the run and every Resume."""
        if isinstance(objs, QuerySet):
            counts = dict(objs.order_by().values_list("taskset").annotate(n=Count("pk")))
        else:
            counts = Counter(task.taskset_id for task in objs)
        tasksets = list(Taskset.all_objects.filter(pk__in=counts))
        deleted = [f"{counts[taskset.pk]:,} of the {taskset.task_count:,} tasks of taskset {taskset.name}"
                   for taskset in tasksets]
        protected = readers(tasksets, or_else=", or copy the taskset without these tasks")
        return deleted, {"tasks": f"{sum(counts.values()):,}"}, set(), protected

    def delete_model(self, request, obj):
        self.delete_queryset(request, Task.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        """Delete, and count each taskset's own tasks again: its pages and API said 20 tasks over none."""
        with transaction.atomic():
            tasksets = set(queryset.order_by().values_list("taskset", flat=True).distinct())
            queryset.delete()
            for taskset in Taskset.all_objects.filter(pk__in=tasksets):
                taskset.task_count = taskset.own_tasks.count()
                taskset.save(update_fields=["task_count"])

    @admin.display(description="prompt")
    def short_prompt(self, task):
        return task.prompt_text[:80]


@admin.register(TasksetImport)
class TasksetImportAdmin(CheckedSelectionMixin, JobAdminMixin, admin.ModelAdmin):  # Cancel, never Delete, while it runs
    list_display = ("id", "original_filename", "name", "status", "rows_done", "taskset", "created_by", "created_at")
    list_filter = ("status",)
    list_select_related = ("taskset", "created_by")

    def has_add_permission(self, request):
        return False  # imports are started from the upload page

    def has_change_permission(self, request, obj=None):
        return False
