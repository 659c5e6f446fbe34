import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import lazy
from django.utils.html import format_html

from apps.buffer.admin import confirm_action
from apps.buffer.models import Experience
from apps.buffer.retention import RetentionRefused, droppable, start_retention
from apps.core.admin_selection import CheckedSelectionMixin
from apps.core.counts import EstimatedCountPaginator
from apps.core.problems import sentence

from . import deletion, notes, services, summaries
from .models import Checkpoint, MetricPoint, Run, Sweep

RETENTION_KEEPS = (
    "Human edits (other runs train on them) and rows with feedback (ratings, preferences, flags) stay. "
    "The selected runs can no longer be resumed: Launch again starts a new run from a run's config. A job does "
    "it in the background, and its page shows the progress."
)


class TypedTags(str):
    """Tags text as the admin typed it, shown back as it is after an error."""


class TagsField(forms.CharField):
    """A run's tags as a JSON list of words, by the rule of the run page's own tag editing
    (notes.tags_from_json). The model's JSON field took any JSON: "baseline", 5 or {"a": 1} broke
    every runs page, and null or a 5,000-deep list was a 500 on save."""

    def bound_data(self, data, initial):
        return initial if self.disabled else TypedTags(data or "")

    def prepare_value(self, value):
        # A stored value as it is, even one no page shows (notes.shown_tags), so it can be fixed here.
        return value if isinstance(value, TypedTags) else json.dumps(value)

    def to_python(self, value):
        return notes.tags_from_json(super().to_python(value))


class RunAdminForm(forms.ModelForm):
    tags = TagsField(required=False, help_text=(
        f'A JSON list of at most {notes.MAX_TAGS} tags, e.g. ["baseline", "lr-sweep"]; each has {notes.TAG_RULE}.'
    ))
    # The version of the notes and tags this form was opened on, as the run page's form has it
    # (notes.set_notes_and_tags): a curator's save here overwrote a save made meanwhile on the run
    # page without a word, and left its version as it was.
    opened_notes_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["opened_notes_version"].initial = self.instance.notes_version

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is None or not {"notes", "tags"} & set(self.changed_data):
            return cleaned
        # Locked until the save commits (the admin's change view is one transaction; SQLite's are
        # IMMEDIATE, so there the whole view already holds the write lock): a run-page save between
        # this check and the save was overwritten, both counting as version 1.
        run = Run.objects.select_for_update().get(pk=self.instance.pk)
        if cleaned.get("opened_notes_version") != run.notes_version:
            raise forms.ValidationError(f"Notes and tags not saved: {notes.changed_by(run)} since you opened this "
                                        "page. Reload it to see theirs, then make your change again.")
        return cleaned


@admin.register(Run)
class RunAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """Runs are launched through the launch checks (services.launch_run), never added here, and
    what workers act on (config, status, where its groups meet, ...) is read-only: a curator's
    edit must not reach a worker unchecked (a rendezvous address made followers join a stranger's
    group; a config edit skipped the model-path confinement). Run.secret is not shown at all."""

    form = RunAdminForm
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
    actions = ("archive_buffer", "drop_buffer")
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
        "queued_tasks",
        "resumes",
        "created_at",
        "started_at",
        "finished_at",
        "buffer_retired",
        "sweep",
        "swept",
    )
    exclude = ("buffer_retired_at", "buffer_retirement")  # shown as buffer_retired, with its job

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        # Only what the form changed: a whole-row save wrote back the status, steps and heartbeats
        # read when the page was posted, over what the run's workers wrote meanwhile.
        fields = {f.name for f in Run._meta.concrete_fields} & set(form.changed_data)
        if {"notes", "tags"} & fields:  # a save of them, as the run page counts one
            obj.notes_version = form.cleaned_data["opened_notes_version"] + 1  # clean() checked it, row locked since
            obj.notes_changed_by, obj.notes_changed_at = request.user, timezone.now()
            fields |= {"notes_version", "notes_changed_by", "notes_changed_at"}
        obj.save(update_fields=[*fields, "updated_at"])

    # -- deletion (apps/runs/deletion.py): ended runs only, counted, in SQL chunks --

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or obj.status in Run.FINISHED)

    def delete_view(self, request, object_id, extra_context=None):
        """A run that has not ended: back to its page, saying why (the site's 403 named roles)."""
        run = self.get_object(request, unquote(object_id))
        if run is not None and (reasons := deletion.refusals([run])):
            self.message_user(request, "Not deleted: " + sentence(reasons), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:runs_run_change", args=[run.pk]))
        return super().delete_view(request, object_id, extra_context)

    def get_deleted_objects(self, objs, request):
        runs = list(objs)
        lines, counts = deletion.summary(runs)
        return lines, counts, set(), deletion.refusals(runs)  # protected: the page refuses, naming them

    def delete_queryset(self, request, queryset):
        deletion.delete_runs(queryset)

    def delete_model(self, request, obj):
        deletion.delete_runs([obj])

    # -- buffer retention (apps/buffer/retention.py) --

    def has_retire_permission(self, request):
        """Retiring a buffer deletes experiences: whoever may delete them (curators, staff)."""
        return request.user.has_perm("buffer.delete_experience")

    @admin.action(description="Archive the buffer of the selected ended runs", permissions=["retire"])
    def archive_buffer(self, request, queryset):
        return self._retire(request, queryset, "archive", "The rollouts, synthetic and expert rows of the selected "
                            "runs are written to a Parquet file (the job's File, an experience export), then deleted. ")

    @admin.action(description="Drop the buffer of the selected ended runs", permissions=["retire"])
    def drop_buffer(self, request, queryset):
        return self._retire(request, queryset, "drop", "The rollouts, synthetic and expert rows of the selected "
                            "runs are deleted, with no copy kept. This cannot be undone. ")

    def _retire(self, request, queryset, action: str, what: str):
        not_ended = queryset.exclude(status__in=Run.FINISHED).values_list("name", "pk", "status")
        if not_ended:
            names = ", ".join(f"{name} (#{pk}, {status})" for name, pk, status in not_ended)
            self.message_user(request, f"Only ended runs (stopped, completed, failed) give up their buffer; "
                              f"not: {names}. Nothing was started.", messages.ERROR)
            return None

        def perform(_, runs):
            try:
                job = start_retention(runs, action=action, user=request.user)
            except RetentionRefused as err:
                self.message_user(request, f"{str(err)[0].upper()}{str(err)[1:]}. Nothing was started.",
                                  messages.ERROR)
                return None
            return HttpResponseRedirect(reverse("admin:buffer_bufferjob_change", args=[job.pk]))

        def description():  # counted when the page is shown, not again on confirmation
            rows = Experience.objects.filter(run__in=queryset)
            going, held = droppable(rows).count(), rows.count()
            counts = (f"{going:,} of the {held:,} experience{'s' * (held != 1)} in their buffer "
                      f"{'goes' if going == 1 else 'go'}. ")
            return what + counts + RETENTION_KEEPS

        title = f"{action.capitalize()} the buffer"
        return confirm_action(self, request, queryset, title, lazy(description, str)(), perform=perform)

    @admin.display(description="buffer")
    def buffer_retired(self, run):
        if run.buffer_retired_at is None:
            return "in the buffer"
        record = run.buffer_retirement
        how = services.RETIRED.get(record.get("action"), "retired")
        when = f"{how} {run.buffer_retired_at:%Y-%m-%d %H:%M}"
        if record.get("state") == "in progress":
            when = f"being {how} since {run.buffer_retired_at:%Y-%m-%d %H:%M}"
        elif record.get("state") == "partial":
            when = (f"{record['deleted']:,} rows deleted before the job {record.get('stopped', 'stopped')} "
                    f"(archive: {record.get('archive') or 'none'})")
        job = run.buffer_retirement.get("job")
        if not job:
            return when
        link = reverse("admin:buffer_bufferjob_change", args=[job])
        return format_html('{} by <a href="{}">retention job {}</a>', when, link, job)

    @admin.display(description="experiences")
    def experiences(self, run):
        # A link, not a count: counting a run's experiences reads all of them.
        url = reverse("admin:buffer_experience_changelist") + f"?run__id__exact={run.pk}"
        return format_html('<a href="{}">experiences</a>', url)


@admin.register(MetricPoint)
class MetricPointAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """What the run's workers logged, to look at: a point added or changed here would be a figure
    no worker measured."""

    list_display = ("run", "role", "step", "time")
    list_filter = ("role", "run")
    list_select_related = ("run",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        summaries.forget(MetricPoint.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        summaries.forget(queryset)  # the runs table's summaries no longer count them


@admin.register(Checkpoint)
class CheckpointAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """Checkpoints are the trainer's record of what it saved: a worker resumes from `path` and
    researchers download it, so nothing here changes them. Deleting one (apps/runs/deletion.py)
    is for ended runs only; its page says where each run would then resume from, and the
    checkpoint's directory goes with it."""

    list_display = ("run", "version", "step", "path", "created_at")
    list_filter = ("run",)
    list_select_related = ("run",)
    readonly_fields = ("run", "version", "step", "path", "created_at")

    def has_add_permission(self, request):
        return False

    def delete_view(self, request, object_id, extra_context=None):
        """A checkpoint of a run that has not ended: back to its page, saying why."""
        checkpoint = self.get_object(request, unquote(object_id))
        if checkpoint is not None and (reasons := deletion.checkpoint_refusals([checkpoint])):
            self.message_user(request, "Not deleted: " + sentence(reasons), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:runs_checkpoint_change", args=[checkpoint.pk]))
        return super().delete_view(request, object_id, extra_context)

    def get_deleted_objects(self, objs, request):
        checkpoints = list(objs)
        counts = {"checkpoints": f"{len(checkpoints):,}"}
        return deletion.checkpoint_summary(checkpoints), counts, set(), deletion.checkpoint_refusals(checkpoints)

    def delete_queryset(self, request, queryset):
        deletion.delete_checkpoints(queryset.select_related("run"))

    def delete_model(self, request, obj):
        deletion.delete_checkpoints([obj])


@admin.register(Sweep)
class SweepAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    """A sweep's record of how its runs were made: only its name changes here. Deleting it keeps
    its runs (they lose the link to it)."""

    list_display = ("name", "owner", "method", "count", "created_at", "ended_at")
    list_select_related = ("owner",)
    search_fields = ("name",)
    readonly_fields = ("owner", "method", "space", "count", "seed", "base_config", "created_at", "ended_at")

    def has_add_permission(self, request):
        return False
