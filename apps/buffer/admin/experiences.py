"""The experiences: list, filters, full-text search, bulk actions, a readable detail page, expert data import."""

import json

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.postgres.search import SearchQuery
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Length, Substr
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from apps.core.admin_selection import CheckedSelectionMixin
from apps.core.counts import EstimatedCountPaginator
from apps.feedback.models import Feedback

from .. import curation, expert_import, search, services
from ..forms import ExpertDataUploadForm, PipelineForm, PriorityForm, RescoreForm
from ..models import Experience
from .actions import ExportActionForm, confirm_action, export_action
from .filters import FlaggedFilter, HasFeedbackFilter, RewardRangeFilter, RunFilter

PREVIEW_CHARS = 80
RELATED_ROWS = 50  # siblings, children and feedback shown on the detail page
TOKEN_ARRAYS = ("prompt_ids", "response_ids", "action_mask", "logprobs")


def feedback_count():
    counted = Feedback.objects.filter(experience=OuterRef("pk")).order_by().values("experience").annotate(n=Count("pk"))
    return Coalesce(Subquery(counted.values("n"), output_field=IntegerField()), 0)


def response_tokens():
    return Length("response_ids") / 4  # int32 token ids: 4 bytes a token


def with_previews(queryset):
    """Short prompt and response, cut in the database: a row's texts may be megabytes."""
    return queryset.annotate(
        prompt_preview=Substr("prompt_text", 1, PREVIEW_CHARS),
        response_preview=Substr("response_text", 1, PREVIEW_CHARS),
    )


LIST_FIELDS = (
    "id", "run__name", "dataset__name", "explorer_step", "source", "status", "reward", "model_version", "created_at"
)


class ExperienceChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        # Only the shown columns: the list never loads token arrays, texts or metadata.
        queryset = super().get_queryset(request, exclude_parameters)
        return with_previews(queryset.select_related("run", "dataset").only(*LIST_FIELDS)).annotate(
            tokens=response_tokens(), feedback_count=feedback_count()
        )


def preview(text: str | None) -> str:
    if not text:
        return ""
    return text if len(text) < PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


@admin.register(Experience)
class ExperienceAdmin(CheckedSelectionMixin, admin.ModelAdmin):
    # What a curator reads first comes first: at 1366 px the admin's sidebar leaves ~700 px, and
    # the texts placed last were cut off.
    list_display = (
        "id",
        "prompt",
        "response",
        "reward",
        "source",
        "status",
        "feedback",
        "step",
        "version",
        "tokens",
        "run_name",
    )
    list_filter = (
        ("run", RunFilter),
        "dataset",
        "source",
        "status",
        ("reward", RewardRangeFilter),
        HasFeedbackFilter,
        FlaggedFilter,
    )
    search_fields = ("prompt_text", "response_text")  # the search box; get_search_results does the searching
    search_help_text = 'Full-text search of prompt and response: words, "a phrase", -excluded, or.'
    ordering = ("-id",)
    sortable_by = ("id", "step", "reward", "version")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # counts per filter choice: a count of the table each
    list_per_page = 100
    action_form = ExportActionForm
    actions = (
        "mark_ready",
        "mark_rejected",
        "set_priority",
        "promote_to_expert",
        "rescore",
        "run_pipeline_operator",
        "export_selection",
        "delete_selection",
    )
    fieldsets = (
        (None, {"fields": ("status", "priority")}),
        (
            "Where it comes from",
            {
                "fields": (
                    "run",
                    "dataset",
                    "task",
                    "source",
                    "explorer_step",
                    "group_id",
                    "rollout_index",
                    "model_version",
                    "parent",
                    "created_at",
                )
            },
        ),
        ("Training", {"fields": ("reward", "advantage", "use_count", "claimed_at", "consumed_at")}),
        ("Metadata", {"fields": ("metadata_json",)}),
    )
    readonly_fields = (
        "run",
        "dataset",
        "task",
        "source",
        "explorer_step",
        "group_id",
        "rollout_index",
        "model_version",
        "parent",
        "created_at",
        "reward",
        "advantage",
        "use_count",
        "claimed_at",
        "consumed_at",
        "metadata_json",
    )
    change_form_template = "admin/buffer/experience/change_form.html"

    # -- the list --

    def get_changelist(self, request, **kwargs):
        return ExperienceChangeList

    def get_queryset(self, request):
        # Token arrays are read only when the detail page is asked for them (see _detail_context);
        # an import's rows only once it has finished (its actions, exports and search too).
        return super().get_queryset(request).exclude(expert_import.staged()).defer(*TOKEN_ARRAYS)

    def get_search_results(self, request, queryset, search_term):
        if not search_term.strip():
            return queryset, False
        if connections[queryset.db].vendor != "postgresql":  # embedded SQLite: the same syntax, its FTS5 index
            return queryset.filter(search.websearch_q(search_term)), False
        left = search.catch_up()  # documents for what was written since the last indexer round
        if left:
            self.message_user(
                request, f"About {left:,} experiences written in the last moments are not searchable yet: "
                "their search index is being built. Search again in a minute to include them.", messages.WARNING,
            )
        query = SearchQuery(search_term, config="simple", search_type="websearch")
        return queryset.filter(search__document=query), False

    @admin.display(description="run", ordering="run")  # its id: names are long; the filter names it
    def run_name(self, experience):
        return f"#{experience.run_id}" if experience.run_id else f"imported: {experience.dataset}"

    @admin.display(description="step", ordering="explorer_step")
    def step(self, experience):
        return experience.explorer_step

    @admin.display(description="version", ordering="model_version")
    def version(self, experience):
        return experience.model_version

    @admin.display(description="tokens")
    def tokens(self, experience):
        return experience.tokens

    @admin.display(description="feedback")
    def feedback(self, experience):
        return experience.feedback_count or ""

    @admin.display(description="prompt")
    def prompt(self, experience):
        return preview(experience.prompt_preview)

    @admin.display(description="response")
    def response(self, experience):
        return preview(experience.response_preview)

    # -- bulk actions: each asks for confirmation (and its options) first --

    @admin.action(description="Mark selected experiences ready", permissions=["change"])
    def mark_ready(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Mark ready",
            "They become available to the trainer again.",
            perform=lambda data, rows: self._done(
                request, services.set_status(rows, Experience.Status.READY), "marked ready"
            ),
        )

    @admin.action(description="Mark selected experiences rejected", permissions=["change"])
    def mark_rejected(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Mark rejected",
            "The trainer will not sample them.",
            perform=lambda data, rows: self._done(
                request, services.set_status(rows, Experience.Status.REJECTED), "marked rejected"
            ),
        )

    @admin.action(description="Set the priority of selected experiences", permissions=["change"])
    def set_priority(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Set priority",
            "The trainer counts a row's priority as uses it has not had: a row of priority 2 is sampled "
            "before rows used as often as it, and expert data is reused twice more than the rest. 0 is the default.",
            form_class=PriorityForm,
            perform=lambda data, rows: self._done(
                request, services.set_priority(rows, data["priority"]), f"set to priority {data['priority']}"
            ),
        )

    @admin.action(description="Promote selected experiences to expert data", permissions=["change"])
    def promote_to_expert(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Promote to expert data",
            "Each becomes an expert copy (ready, same run, the original as its parent) that SFT and MIX imitate. "
            "Expert rows and rows promoted before are skipped. Runs as a job.",
            perform=lambda data, rows: self._job_started(curation.start_promotion(rows, user=request.user)),
        )

    @admin.action(description="Re-score selected experiences with a reward fn", permissions=["change"])
    def rescore(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Re-score with a reward fn",
            "Reward and reward components are recomputed from each response and its task (rows without a task "
            "are skipped); annotators' ratings (the human component) stay, the previous reward is kept in metadata. "
            "The advantages of the rescored rollouts' groups are recomputed with their run's advantage fn on the rows "
            "no trainer step has consumed or is training on; training already done is unaffected, and such a row keeps "
            "the advantage it trained with (the result counts them). Runs as a job.",
            form_class=RescoreForm,
            perform=lambda data, rows: self._job_started(
                curation.start_rescore(rows, reward_fn=data["reward_fn"], user=request.user)
            ),
        )

    @admin.action(description="Run a pipeline operator over selected experiences", permissions=["change"])
    def run_pipeline_operator(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Run an experience pipeline operator",
            "The operator sees the selection one task at a time, as the explorer's pipeline would. Rows it drops "
            "become rejected, changes it makes are saved, experiences it adds are inserted. Runs as a job.",
            form_class=PipelineForm,
            perform=lambda data, rows: self._job_started(
                curation.start_pipeline(rows, operator=data["operator"], params=data["params"], user=request.user)
            ),
        )

    @admin.action(description="Export selected experiences", permissions=["view"])
    def export_selection(self, request, queryset):
        return export_action(self, request, queryset)

    @admin.action(description="Delete selected experiences", permissions=["delete"])
    def delete_selection(self, request, queryset):
        return self._confirm(
            request,
            queryset,
            "Delete",
            "The experiences and all feedback on them are deleted; human edits made from them stay. "
            "This cannot be undone.",
            perform=lambda data, rows: self._done(request, services.delete_experiences(rows), "deleted"),
        )

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # loads every row first: delete_selection does it in SQL
        return actions

    def _confirm(self, request, queryset, title, description, *, perform, form_class=None):
        return confirm_action(self, request, queryset, title, description, perform=perform, form_class=form_class)

    def _done(self, request, count: int, what: str):
        self.message_user(request, f"{count:,} experience{'' if count == 1 else 's'} {what}.", messages.SUCCESS)

    def _job_started(self, job):
        return HttpResponseRedirect(reverse("admin:buffer_bufferjob_change", args=[job.pk]))

    # -- the detail page --

    def has_add_permission(self, request):
        return False  # experiences come from runs and imports, not from a blank form

    def delete_model(self, request, obj):
        services.delete_experiences(Experience.objects.filter(pk=obj.pk))

    def get_deleted_objects(self, objs, request):
        """Django's list. The judgements on a row go with it (services.delete_experiences), though
        the feedback admin deletes none itself (a plain delete there left training out of step)."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        perms_needed.discard(Feedback._meta.verbose_name)
        return deleted, counts, perms_needed, protected

    def save_model(self, request, obj, form, change):
        # Only the two curated fields, as updates: a trainer may be changing the row's use count meanwhile.
        selection = Experience.objects.filter(pk=obj.pk)
        services.set_status(selection, form.cleaned_data["status"])
        services.set_priority(selection, form.cleaned_data["priority"])

    @admin.display(description="metadata")
    def metadata_json(self, experience):
        return format_html(
            "<pre class='buffer-json'>{}</pre>", json.dumps(experience.metadata, indent=2, ensure_ascii=False)
        )

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self._detail_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _detail_context(self, request, experience) -> dict:
        show_tokens = request.GET.get("tokens") == "1"
        arrays = Experience.objects.filter(pk=experience.pk)
        token_counts = (
            arrays.annotate(prompt_tokens=Length("prompt_ids") / 4, response_tokens=Length("response_ids") / 4)
            .values("prompt_tokens", "response_tokens")
            .get()
        )
        siblings = (
            with_previews(Experience.objects.filter(run_id=experience.run_id, group_id=experience.group_id))
            .exclude(pk=experience.pk)
            .only("id", "rollout_index", "source", "status", "reward", "advantage")
            .order_by("rollout_index", "id")[:RELATED_ROWS]
            if experience.group_id
            else []
        )
        children = with_previews(experience.children.all()).only("id", "source", "status", "reward").order_by("id")
        feedback = (
            Feedback.objects.filter(Q(experience=experience) | Q(other=experience))
            .select_related("user")
            .order_by("-updated_at")[:RELATED_ROWS]
        )
        return {
            "experience": experience,
            "turns": experience.messages
            or [
                {"role": "prompt", "content": experience.prompt_text},
                {"role": "response", "content": experience.response_text},
            ],
            "reward_components": sorted(experience.reward_components.items()),
            "token_counts": token_counts,
            "tokens": arrays.values(*TOKEN_ARRAYS).get() if show_tokens else None,
            "siblings": siblings,
            "children": children[:RELATED_ROWS],
            "feedback_rows": feedback,
        }

    # -- importing expert data --

    def get_urls(self):
        return [
            path("import/", self.admin_site.admin_view(self.import_view), name="buffer_experience_import"),
            *super().get_urls(),
        ]

    def import_view(self, request):
        if not request.user.has_perm("buffer.add_experience"):
            raise PermissionDenied
        form = ExpertDataUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            job = expert_import.start_import(
                upload=form.cleaned_data["file"],
                dataset=form.cleaned_data["dataset"],
                append=form.cleaned_data["append"],
                layout=form.cleaned_data["layout"],
                fmt=form.cleaned_data["format"],
                user=request.user,
            )
            return self._job_started(job)
        context = {
            **self.admin_site.each_context(request),
            "title": "Import expert data",
            "opts": self.opts,
            "form": form,
        }
        return TemplateResponse(request, "admin/buffer/experience/import.html", context)
