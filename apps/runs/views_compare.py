"""Compare runs (charts, config diff, summary), download their metrics (CSV, JSON), and edit a
run's notes and tags. Every researcher reads; notes and tags are their run owner's (and curators')."""

import csv
import io
import json

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, role_required
from apps.core.numbers import whole_number
from apps.core.problems import sentence
from apps.core.streaming import streaming
from rftweb.errors import bad_request_response, form_checks_nul, is_api

from . import comparison, queries, samples
from .api import token_or_session
from .compression import gzip_json
from .forms import ReportForm
from .models import Run
from .notes import NotesChanged, keep_draft, set_notes_and_tags
from .views import PLOTLY_VERSION, chart_view

COMPARE_PICKER_RUNS = 50
UNENDED = (Run.Status.QUEUED, *Run.ACTIVE)  # runs whose charts may still grow
CSV_HEADER = ("run", "name", "step", "key", "value", "time")
CHUNK_CHARS = 64 * 1024  # one network write: a row at a time would be millions of tiny writes


@role_required(RESEARCHER)
def run_compare(request):
    """The runs picked (?runs=1&runs=2): their config differences, a summary of each, one chart per
    metric with a line per run (?filter=, ?smoothing=, ?log=, ?x=: views.chart_view), and the
    samples panel (?step=, ?task=). The picker lists the newest runs, or those ?q= finds."""
    ids, problems = comparison.picked_ids(request.GET)
    for problem in problems:  # the page shows the runs that were named right
        messages.error(request, "Not compared: " + sentence([problem]))
    picked = comparison.runs_in_order(ids)
    context = compare_context(picked, view=chart_view(request.GET), search=request.GET.get("q", "").strip()[:200],
                              task=whole_number(request.GET.get("task")), step=whole_number(request.GET.get("step")))
    return render(request, "runs/compare.html", context)


def picker_runs(search: str = ""):
    """The runs the picker offers: the newest, or those whose name holds `search` (or whose id it
    is: "12", "#12"), newest first, COMPARE_PICKER_RUNS at most (only the newest 50 could be picked:
    an older run was out of reach)."""
    runs = Run.objects.select_related("owner")
    if search:
        number = whole_number(search.removeprefix("#"))
        runs = runs.filter(Q(name__icontains=search) | (Q(pk=number) if number is not None else Q()))
    return list(runs[:COMPARE_PICKER_RUNS])


def compare_context(picked: list[Run], *, view: dict, search: str = "", task: int | None = None,
                    step: int | None = None) -> dict:
    """What runs/compare.html shows of these runs (the compare page's, and a report's); `view`: the
    charts' toolbar settings (views.chart_view); `search`: the picker's (picker_runs). The
    charts of the runs that have not ended follow them as they train (compare.js), as the run page
    does: W&B's panels follow live runs, and a sweep's runs were drawn as they were when the page
    loaded, until it was loaded again."""
    found = picker_runs(search)
    choices = picked + [run for run in found if run not in picked]  # the picked ones first, ticked
    series = [
        {
            "id": run.pk,
            "name": run.name,
            "status": run.status,
            "metrics_url": reverse("run-metrics-json", args=[run.pk]),
            "url": reverse("run-detail", args=[run.pk]),
            **({"live_url": reverse("run-live", args=[run.pk]), "ws_path": f"/ws/runs/{run.pk}/"}
               if run.status in UNENDED else {}),
        }
        for run in picked
    ]
    step = samples.default_step(picked) if step is None and picked else step
    tasks = samples.task_choices(picked, step) if picked else []
    return {
        "choices": choices, "run_search": search, "run_search_found": len(found),
        "picker_more": len(found) == COMPARE_PICKER_RUNS,
        "picked": {run.pk for run in picked},
        "picked_runs": picked,
        "config_diff": comparison.config_diff(picked),
        "summary": comparison.summary_rows(comparison.run_summaries(picked)),
        "download_query": "?" + "&".join(f"runs={run.pk}" for run in picked),
        "series": series,
        "overview": queries.overview_charts(),
        "plotly_version": PLOTLY_VERSION,
        **view,
        "sample_step": step, "sample_task": task, "sample_tasks": tasks,
        "sample_columns": samples.columns(picked, task, step) if task is not None and picked else [],
        "report_max_runs": ReportForm.MAX_RUNS,
        "report_excess": max(0, len(picked) - ReportForm.MAX_RUNS),  # said before a name is typed
        "report_form": ReportForm(initial={
            "runs": ",".join(str(run.pk) for run in picked), "sample_task": task,
            "sample_step": step if task is not None else None,
        }),
    }


# ---- downloads ---------------------------------------------------------------------------------


def _download_name(runs: list[Run]) -> str:
    if len(runs) == 1:
        return f"{slugify(runs[0].name) or 'run'}-{runs[0].pk}-metrics"
    return "runs-" + "-".join(str(run.pk) for run in runs) + "-metrics"


def _csv_chunks(runs: list[Run]):
    """Long format, a row per value: run, name, step, key ("role/key", as the charts name it),
    value (empty for a diverged one, stored as null), time (ISO 8601, UTC)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_HEADER)
    for run in runs:
        name = comparison.safe_cell(run.name)
        for role, step, time, values in comparison.metric_points(run):
            stamp = time.isoformat()
            for key, value in comparison.flat_values(values):
                if isinstance(value, bool):
                    value = int(value)
                elif isinstance(value, list):
                    value = json.dumps(value)
                writer.writerow((run.pk, name, step, comparison.safe_cell(f"{role}/{key}"),
                                 comparison.safe_cell(value), stamp))
            if buffer.tell() >= CHUNK_CHARS:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
    yield buffer.getvalue()


def _json_run_chunks(run: Run):
    """{"run", "name", "metrics": {role: [{step, time, values}]}}, as the run's live snapshot has
    them but with ISO times."""
    yield json.dumps({"run": run.pk, "name": run.name})[:-1] + ', "metrics": {'
    role, parts, size = None, [], 0
    for point_role, step, time, values in comparison.metric_points(run):
        if point_role != role:
            parts.append(("]" if role else "") + ("," if role else "") + json.dumps(point_role) + ": [")
            role, first = point_role, True
        point = json.dumps({"step": step, "time": time.isoformat(), "values": values})
        parts.append(point if first else "," + point)
        first, size = False, size + len(point)
        if size >= CHUNK_CHARS:
            yield "".join(parts)
            parts, size = [], 0
    yield "".join(parts) + ("]" if role else "") + "}}"


def _json_chunks(runs: list[Run], *, many: bool):
    if not many:
        yield from _json_run_chunks(runs[0])
        return
    yield '{"runs": ['
    for index, run in enumerate(runs):
        if index:
            yield ","
        yield from _json_run_chunks(run)
    yield "]}"


def _download(chunks, runs: list[Run], extension: str, content_type: str) -> StreamingHttpResponse:
    response = streaming(chunks, content_type=content_type)  # a long run's points never sit in memory
    filename = f"{_download_name(runs)}.{extension}"
    response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename=filename)
    return response


@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def run_metrics_csv(request, pk):
    runs = [get_object_or_404(Run, pk=pk)]
    return _download(_csv_chunks(runs), runs, "csv", "text/csv; charset=utf-8")


@gzip_json  # the compare page fetches one per run: 7.6 MB for 5,000 steps
@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def run_metrics_json(request, pk):
    runs = [get_object_or_404(Run, pk=pk)]
    return _download(_json_chunks(runs, many=False), runs, "json", "application/json")


@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def compare_metrics_csv(request):
    runs, refusal = _picked_runs(request)
    if refusal:
        return refusal
    return _download(_csv_chunks(runs), runs, "csv", "text/csv; charset=utf-8")


@gzip_json
@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def compare_metrics_json(request):
    runs, refusal = _picked_runs(request)
    if refusal:
        return refusal
    return _download(_json_chunks(runs, many=True), runs, "json", "application/json")


def _picked_runs(request) -> tuple[list[Run], HttpResponse | None]:
    """(the runs a download names (?runs=), the answer refusing it or None): a 400 naming each
    value that is no id (an id past a bigint read as no run given at all), or no run given."""
    ids, problems = comparison.picked_ids(request.GET)
    if problems:
        return [], bad_request_response(request, "; ".join(problems))
    runs = comparison.runs_in_order(ids)
    return runs, None if runs else _no_runs(request)


def _no_runs(request):
    message = "Pick the runs to download: no run was given (?runs=<id>&runs=<id>)."
    if is_api(request):  # a script's, by its token
        return JsonResponse({"error": message}, status=400)
    messages.error(request, message)
    return redirect("run-compare")


# ---- notes and tags ----------------------------------------------------------------------------


@form_checks_nul  # notes.set_notes_and_tags names one, and the page keeps the draft
@require_POST
@role_required(RESEARCHER)
def run_notes(request, pk):
    """Save the notes and tags of the run page's form (PermissionDenied: 403 for another's run)."""
    run = get_object_or_404(Run, pk=pk)
    notes, tags = request.POST.get("notes", ""), request.POST.get("tags", "")
    version = whole_number(request.POST.get("version"))  # None: notes.set_notes_and_tags refuses it
    try:
        set_notes_and_tags(run, request.user, notes=notes, tags=tags, version=version)
    except NotesChanged as err:
        messages.error(request, f"Notes and tags not saved: {err.message}. Theirs are shown above, yours are in the "
                                "form: merge them and Save again.")
        # The form goes on from their version: saved again, it replaces what the page shows.
        keep_draft(request.session, run, notes=notes, tags=tags, version=run.notes_version)
        return redirect(reverse("run-detail", args=[pk]) + "#run-notes")
    except ValidationError as err:
        messages.error(request, "Notes and tags not saved: " + sentence(err.messages))
        keep_draft(request.session, run, notes=notes, tags=tags, version=version)  # the form opens with them again
        return redirect(reverse("run-detail", args=[pk]) + "#run-notes")
    else:
        messages.success(request, f"Saved the notes and tags of {run.name}.")
    return redirect("run-detail", pk=pk)
