"""Reports (issue #44, item 3): a comparison saved with a name and a note, opened by its link by
every researcher (as every researcher reads every run); its owner and curators rename, re-note or
delete it. Its page is the compare page's, as it was saved."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.accounts.roles import CURATOR, RESEARCHER, has_role, role_required
from apps.core.bidi import isolate
from apps.core.numbers import whole_number, whole_numbers
from apps.core.problems import form_problems, sentence
from rftweb.errors import form_checks_nul

from . import comparison
from .forms import ReportForm
from .models import Report, Run
from .views import chart_view
from .views_compare import compare_context

REPORTS_PER_PAGE = 50


def may_edit(user, report: Report) -> bool:
    return report.owner_id == user.pk or has_role(user, CURATOR)


@role_required(RESEARCHER)
def report_list(request):
    page = Paginator(Report.objects.select_related("owner"), REPORTS_PER_PAGE).get_page(request.GET.get("page"))
    # The runs each report shows: its page leaves out a run deleted since, so the count does too.
    wanted = {pk for report in page.object_list for pk in report.run_ids}
    there = set(Run.objects.filter(pk__in=wanted).values_list("pk", flat=True))
    for report in page.object_list:
        report.runs_there = sum(pk in there for pk in report.run_ids)
        report.runs_gone = len(report.run_ids) - report.runs_there
    return render(request, "runs/reports.html", {"page": page})


@form_checks_nul
@require_POST
@role_required(RESEARCHER)
def report_save(request):
    """Save the compare page's comparison as a report. A refused one comes back as the compare
    page of its runs, its form holding what was typed and the errors: it redirected to Compare,
    and the name, note, filter and smoothing were lost."""
    form = ReportForm(request.POST, instance=Report(owner=request.user))
    if not form.is_valid():
        messages.error(request, "Report not saved: " + sentence(form_problems(form)))
        ids = whole_numbers(request.POST.get("runs", "").split(","))[:ReportForm.MAX_RUNS]
        view = chart_view({"filter": request.POST.get("chart_filter", ""),
                           "smoothing": request.POST.get("chart_smoothing", "")})
        runs = comparison.runs_in_order(ids)
        # Offered again with the runs that are there: one deleted since (named in the message)
        # would refuse every later try.
        form.data = form.data.copy()
        form.data["runs"] = ",".join(str(run.pk) for run in runs)
        context = compare_context(runs, view=view,
                                  task=whole_number(request.POST.get("sample_task")),
                                  step=whole_number(request.POST.get("sample_step")))
        return render(request, "runs/compare.html", {**context, "report_form": form}, status=400)
    report = form.save()
    messages.success(request, f"Saved report {isolate(report.name)}: anyone who may read its runs opens it by "
                              "this page's link.")
    return redirect("report-detail", pk=report.pk)


@role_required(RESEARCHER)
def report_detail(request, pk):
    report = get_object_or_404(Report.objects.select_related("owner"), pk=pk)
    return _report_page(request, report, ReportForm(instance=report))


def _report_page(request, report: Report, edit_form: ReportForm, status: int = 200):
    runs = comparison.runs_in_order(report.run_ids)
    context = compare_context(runs, view=chart_view({"filter": report.chart_filter}, report.chart_smoothing),
                              task=report.sample_task, step=report.sample_step)
    gone = [pk for pk in report.run_ids if pk not in {run.pk for run in runs}]
    return render(request, "runs/compare.html", {**context, "report": report, "gone": gone,
                                                 "may_edit": may_edit(request.user, report), "edit_form": edit_form},
                  status=status)


@form_checks_nul
@require_POST
@role_required(RESEARCHER)
def report_edit(request, pk):
    """Rename, re-note or delete a report. A refused edit comes back as the report's page with
    the form open, holding what was typed (it redirected, and the typing was lost). An edit from a
    page opened before another's save (its `version`) is refused naming who saved and when: it
    used to overwrite their name and note without a word."""
    report = get_object_or_404(Report, pk=pk)
    if not may_edit(request.user, report):
        raise PermissionDenied(f"only its owner ({report.owner}) or a curator may change report {report.name!r}")
    typed = {key: request.POST.get(key) for key in ("name", "note")}
    version = whole_number(request.POST.get("version"))
    if version is None:  # as the run's notes refuse it (notes.set_notes_and_tags): what it replaces is unknown
        messages.error(request, "Report not saved: the form did not say which version of it you edit. Reload the "
                                "page and Save again; what you typed is in the form.")
        return _report_page(request, report, ReportForm(instance=report, initial=typed), status=400)
    if version != report.version:  # a Delete too: from a page opened before someone's edit, it deleted theirs unseen
        return _changed_since(request, report, typed, deleting=bool(request.POST.get("delete")))
    if request.POST.get("delete"):
        # Over the version checked above only, as an edit saves: an edit committed since is not deleted unseen.
        if not Report.objects.filter(pk=report.pk, version=version).delete()[0]:
            now = Report.objects.filter(pk=report.pk).first()
            if now is None:  # deleted by another tab meanwhile: what this Delete asked for (it was a 500)
                messages.info(request, f"Report {isolate(report.name)} was already deleted (its runs stay).")
                return redirect("report-list")
            return _changed_since(request, now, typed, deleting=True)
        messages.success(request, f"Deleted report {isolate(report.name)} (its runs stay).")
        return redirect("report-list")
    # Runs deleted since it was saved are dropped (as a new report's save offers the rest): kept,
    # they refused every rename ("runs: no run with id 2"), and only deleting the report was left.
    there = set(Run.objects.filter(pk__in=report.run_ids).values_list("pk", flat=True))
    kept, gone = [pk for pk in report.run_ids if pk in there], [pk for pk in report.run_ids if pk not in there]
    if not kept:
        messages.error(request, f"Report not saved: {deleted(gone)}, every run it compared: it has nothing left "
                                "to show. Delete it, or open Compare to save a new report.")
        return _report_page(request, report, ReportForm(instance=report, initial=typed), status=400)
    data = {**request.POST.dict(), "runs": ",".join(map(str, kept)), "chart_filter": report.chart_filter,
            "chart_smoothing": "" if report.chart_smoothing is None else report.chart_smoothing,
            "sample_task": report.sample_task or "", "sample_step": report.sample_step or ""}
    form = ReportForm(data, instance=report)
    if not form.is_valid():
        report.refresh_from_db()  # a refused form has set what it could on the instance: the page shows what is saved
        messages.error(request, "Report not saved: " + sentence(form_problems(form)))
        return _report_page(request, report, form, status=400)
    # Over the version checked above only: another save since (a race with this one) is refused too.
    saved = Report.objects.filter(pk=report.pk, version=version).update(
        name=form.cleaned_data["name"], note=form.cleaned_data["note"], run_ids=kept, version=F("version") + 1,
        changed_by=request.user, updated_at=timezone.now())
    if not saved:
        report.refresh_from_db()
        return _changed_since(request, report, typed)
    report.refresh_from_db()
    dropped = f": {deleted(gone)}; the report now holds {runs_named(kept)}" if gone else ""
    messages.success(request, f"Saved report {isolate(report.name)}{dropped}.")
    return redirect("report-detail", pk=report.pk)


def _changed_since(request, report: Report, typed: dict, deleting: bool = False):
    """The report's page with its saved name and note and, in the form (which goes on from the
    saved version), what was typed: nothing is lost, and Save again replaces theirs."""
    who = report.changed_by.get_username() if report.changed_by else "someone"
    when = f" at {report.updated_at:%Y-%m-%d %H:%M} UTC" if report.version else ""  # version 0: unsaved since made
    changed = f"it was changed by {isolate(who)}{when} since you opened it"
    if deleting:
        messages.error(request, f"Report not deleted: {changed}. Theirs is shown above: Delete again if it should go.")
    else:
        messages.error(request, f"Report not saved: {changed}. Theirs is shown above, yours is in the form: merge "
                                "them and Save again.")
    return _report_page(request, report, ReportForm(instance=report, initial=typed), status=409)


def deleted(ids: list[int]) -> str:
    """"run #2 was deleted", "runs #1, #2 were deleted"."""
    return f"{runs_named(ids)} {'was' if len(ids) == 1 else 'were'} deleted"


def runs_named(ids: list[int]) -> str:
    """"run #2", "runs #1, #3": as the messages of a report's runs name them."""
    return f"run{'s' if len(ids) != 1 else ''} " + ", ".join(f"#{pk}" for pk in ids)
