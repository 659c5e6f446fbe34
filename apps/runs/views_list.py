"""The dashboard and the runs list (docs/runs-list.md): the runs table, its CSV, its columns and
saved views, and stopping the runs checked in it."""
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import content_disposition_header, url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, has_role, role_required
from apps.core.bidi import isolate
from apps.core.numbers import whole_numbers
from apps.core.streaming import streaming
from apps.tasksets.models import Taskset
from rftweb.errors import bad_request_response

from . import queries, run_table, saved_views, services
from .api import token_or_session
from .controls import control_run
from .forms import RunFilterForm
from .models import Run

RUNS_PER_PAGE = 50


def home(request):
    """Researchers land on their dashboard; annotators on what they can do."""
    if not has_role(request.user, RESEARCHER):
        return render(request, "runs/annotator_home.html")
    columns = run_table.parse_columns(",".join(run_table.HOME_COLUMNS))[0]
    newest = queries.with_latest_explorer_metrics(Run.objects.select_related("owner"))[:20]
    return render(request, "runs/home.html", {
        "runs": run_table.with_cells(newest, columns), "table": run_table.TableView(columns),
        "tasksets": Taskset.objects.all()[:20],
    })


def _listed(request) -> tuple[RunFilterForm, run_table.TableView, object]:
    """The list's filters, its view (columns, sort) and the matching runs in its order; what of
    the query was not applied is in the view's errors."""
    filters = RunFilterForm(request.GET)
    view = run_table.table_view(request.GET, run_table.saved_columns(request.user))
    matching = filters.filter(Run.objects.all())
    view.offered = run_table.offered_metrics(matching)
    view.errors += run_table.unrecorded(view, filters.cleaned_data.get("where") or [], view.offered)
    return filters, view, view.order(matching)


@role_required(RESEARCHER)
def run_list(request):
    """The runs table (docs/runs-list.md): the columns picked, sorted by any of them, filtered,
    a page at a time, or grouped by config keys (?group=: a page of groups, one open with
    ?expand=); the same query downloads every matching run, or group, as CSV (run_list_csv)."""
    filters, view, runs = _listed(request)
    views = saved_views.views_of(request.user)
    context = {"filters": filters, "table": view, "picker": run_table.picker(view),
               "where": run_table.where_chips(request.GET), "group_keys": run_table.group_keys(),
               "saved_views": views, "current_view": saved_views.current(views, request.GET)}
    if view.group:
        found = run_table.groups(runs, view)
        context["open_group"], context["runs"] = run_table.expanded(request.GET, found, view, RUNS_PER_PAGE)
        page = Paginator(found, RUNS_PER_PAGE).get_page(request.GET.get("page"))
        run_table.group_links(request.GET, page.object_list, view)
        context.update(page=page, groups=page.object_list, runs_grouped=sum(len(group.runs) for group in found),
                       ungrouped=run_table.ungrouped(request.GET))
    else:
        page = Paginator(queries.with_latest_explorer_metrics(runs.select_related("owner")),
                         RUNS_PER_PAGE).get_page(request.GET.get("page"))
        context.update(page=page, runs=run_table.with_cells(page.object_list, view.columns))
    return render(request, "runs/list.html", {
        **context, "headers": view.headers(request.GET),
        "csv_query": run_table.csv_query(request.GET, filters, view),
    })


@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def run_list_csv(request):
    """The runs list's CSV: its columns for every run its filters match (not the page alone), in
    its order; grouped (?group=), a row per group. A bad column, sort, group or filter, or a
    parameter the list does not read, is a 400 naming it: a file missing a column, or of other
    runs, would pass unnoticed."""
    unknown = [name for name in request.GET if name not in run_table.QUERY_PARAMETERS]
    if unknown:
        return bad_request_response(request, run_table.unknown_parameters(unknown))
    filters, view, runs = _listed(request)
    problems = [f"{name}: {' '.join(errors)}" for name, errors in filters.errors.items()] + view.errors
    if problems:
        return bad_request_response(request, "\n".join(problems))  # a line each
    if view.group:
        chunks = run_table.groups_csv(run_table.groups(runs, view), view)
    else:
        chunks = run_table.csv_chunks(runs, view.columns)
    response = streaming(chunks, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename="runs.csv")
    return response


@require_POST
@role_required(RESEARCHER)
def run_list_columns(request):
    """Save the column picker's choice as the user's (RunListColumns), or forget it ("Default
    columns"), and go back to the list with it in the address (?cols=), to share."""
    query = QueryDict(request.POST.get("query", ""), mutable=True)
    query.pop("page", None)
    query.pop("cols", None)
    if "reset" in request.POST:
        run_table.forget_columns(request.user)
    else:
        picked = ",".join(request.POST.getlist("cols"))
        columns, problems = run_table.parse_columns(picked)
        for problem in problems:
            messages.error(request, f"Columns: {problem}")
        if columns or not problems:  # names alone, picked so, are a choice; none of the asked ones is not
            query["cols"] = ",".join(run_table.save_columns(request.user, picked))
        else:
            messages.error(request, "Columns: none of the picked columns exists; your columns are as they were.")
    return redirect(reverse("run-list") + (f"?{query.urlencode(safe=',/:')}" if query else ""))


@require_POST
@role_required(RESEARCHER)
def run_list_views(request):
    """Save the list as the user sees it under a name (its columns, grouping, sort and valid
    filters: saved_views), or delete one of theirs; back to the list, the saved view open."""
    query = QueryDict(request.POST.get("query", ""), mutable=True)
    back = query
    try:
        if "delete" in request.POST:
            name = saved_views.delete_view(request.user, request.POST["delete"])
            messages.success(request, f"Deleted the view {isolate(name)}.")
        else:
            saved, back, left_out = saved_views.save_from_list(request.user, request.POST.get("name", ""), query)
            messages.success(request, f"Saved the view {isolate(saved.name)}" + (
                f", without what was not applied ({'; '.join(left_out)})." if left_out else "."))
    except saved_views.BadView as err:
        messages.error(request, str(err))
    back.pop("page", None)
    return redirect(reverse("run-list") + (f"?{back.urlencode(safe=',/:')}" if back else ""))


@require_POST
@role_required(RESEARCHER)
def run_bulk_stop(request):
    """Stop every checked run; report the ones that could not stop."""
    stopped, finished, not_theirs = [], [], []
    for run in Run.objects.filter(pk__in=whole_numbers(request.POST.getlist("runs"))):
        try:
            control_run(run, "stop", request.user)
            stopped.append(isolate(run.name))
        except services.InvalidTransition:
            finished.append(f"{isolate(run.name)} ({run.status})")
        except PermissionDenied:
            not_theirs.append(f"{isolate(run.name)} ({isolate(run.owner)})")
    if stopped:
        messages.success(request, f"Stopping {len(stopped)} run{'s' * (len(stopped) != 1)}: {', '.join(stopped)}.")
    if finished:
        messages.error(
            request, f"Could not stop {', '.join(finished)}: only queued, starting, running or paused runs stop."
        )
    if not_theirs:
        messages.error(request, f"Could not stop {', '.join(not_theirs)}: only a run's owner or a curator stops it.")
    if not (stopped or finished or not_theirs):
        messages.info(request, "No runs were selected.")
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(back)
    return redirect("run-list")
