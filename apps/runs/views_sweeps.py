"""Sweeps: the list, and a sweep's page (its table of swept values and results, the parallel-
coordinates chart, links to compare its runs). Launching is the launch form's (views.run_launch)."""

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from apps.accounts.roles import RESEARCHER, role_required

from . import sweeps, waits
from .controls import may_control
from .models import Run, Sweep
from .views import PLOTLY_VERSION

SWEEPS_PER_PAGE = 50


@role_required(RESEARCHER)
def sweep_list(request):
    listed = Sweep.objects.select_related("owner").annotate(
        finished=Count("runs", filter=Q(runs__status__in=Run.FINISHED)), runs_now=Count("runs"),
    )
    page = Paginator(listed, SWEEPS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "sweeps/list.html", {"page": page})


@role_required(RESEARCHER)
def sweep_detail(request, pk):
    sweep = get_object_or_404(Sweep.objects.select_related("owner"), pk=pk)
    shown = sweeps.table(sweep)
    for row in shown["rows"]:
        row["run"].shown_status = waits.shown_status(row["run"])
    runs = sorted((row["run"] for row in shown["rows"]), key=lambda run: run.pk)
    # A stopping run is on its way (its last checkpoint): Stop offered again did nothing more.
    unfinished = [run for run in runs if not run.is_finished and run.status != Run.Status.STOPPING]
    return render(request, "sweeps/detail.html", {
        "sweep": sweep, "table": shown, "space": sweeps.space_text(sweep),
        "runs_left": len(runs), "runs_deleted": max(0, sweep.count - len(runs)),  # a curator deletes runs
        "chart": sweeps.chart_data(shown),
        "compare_url": reverse("run-compare") + "?" + "&".join(f"runs={run.pk}" for run in runs),
        "unfinished": unfinished, "may_stop": unfinished and may_control(request.user, runs[0]),
        "plotly_version": PLOTLY_VERSION,
    })
