from django.http import JsonResponse
from django.shortcuts import get_object_or_404, render

from apps.accounts.roles import RESEARCHER, has_role, role_required
from apps.tasksets.models import Taskset

from .models import Run


def home(request):
    """Researchers land on their dashboard; annotators on what they can do."""
    if not has_role(request.user, RESEARCHER):
        return render(request, "runs/annotator_home.html")
    return render(
        request,
        "runs/home.html",
        {"runs": Run.objects.select_related("owner")[:20], "tasksets": Taskset.objects.all()[:20]},
    )


@role_required(RESEARCHER)
def run_list(request):
    return render(request, "runs/list.html", {"runs": Run.objects.select_related("owner")})


@role_required(RESEARCHER)
def run_detail(request, pk):
    run = get_object_or_404(Run, pk=pk)
    return render(request, "runs/detail.html", {"run": run})


def run_state(run: Run) -> dict:
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "mode": run.mode,
        "explorer_step": run.explorer_step,
        "trainer_step": run.trainer_step,
        "model_version": run.model_version,
        "error": run.error,
    }


@role_required(RESEARCHER)
def run_live(request, pk):
    """The snapshot a live page starts from, and fetches again when it sees a gap in `seq`."""
    # Read the sequence number first: every message numbered at or below it was sent after its
    # data committed, so that data is in what we read next.
    seq = get_object_or_404(Run.objects.only("live_seq"), pk=pk).live_seq
    run = Run.objects.get(pk=pk)
    metrics = {}
    for role, step, values in run.metrics.order_by("role", "step").values_list("role", "step", "values"):
        metrics.setdefault(role, []).append({"step": step, "values": values})
    return JsonResponse({"seq": seq, "run": run_state(run), "metrics": metrics})
