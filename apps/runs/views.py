from django.shortcuts import get_object_or_404, redirect, render

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
