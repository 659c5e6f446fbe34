from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from apps.accounts.roles import CURATOR, RESEARCHER, has_role, role_required

from . import services
from .forms import TasksetUploadForm
from .models import Taskset, TasksetImport

RECENT_IMPORTS = 5


@role_required(RESEARCHER)
def taskset_list(request):
    imports = TasksetImport.objects.filter(created_by=request.user).select_related("taskset")[:RECENT_IMPORTS]
    return render(request, "tasksets/list.html", {"tasksets": Taskset.objects.all(), "imports": imports})


@role_required(RESEARCHER)
def taskset_detail(request, name):
    taskset = get_object_or_404(Taskset, name=name)
    page = Paginator(taskset.tasks.order_by("index"), 50).get_page(request.GET.get("page"))
    return render(request, "tasksets/detail.html", {"taskset": taskset, "page": page})


@role_required(RESEARCHER)
def taskset_upload(request):
    form = TasksetUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        job = services.start_taskset_import(
            upload=data["file"],
            name=data["name"],
            fmt=data["format"],
            mapping=form.mapping,
            description=data["description"],
            default_workflow=data["default_workflow"],
            default_reward_fn=data["default_reward_fn"],
            user=request.user,
        )
        return redirect("taskset-import", pk=job.pk)
    return render(request, "tasksets/upload.html", {"form": form})


def _import_job(request, pk) -> TasksetImport:
    """An import job is seen by the researcher who uploaded the file, and by curators."""
    job = get_object_or_404(TasksetImport.objects.select_related("taskset"), pk=pk)
    if job.created_by_id != request.user.pk and not has_role(request.user, CURATOR):
        raise PermissionDenied("this import belongs to another user")
    return job


@role_required(RESEARCHER)
def taskset_import(request, pk):
    job = _import_job(request, pk)
    return render(request, "tasksets/import.html", {"job": job, "status": _import_status(job)})


@require_GET
@role_required(RESEARCHER)
def taskset_import_status(request, pk):
    job = _import_job(request, pk)
    return JsonResponse(_import_status(job))


def _import_status(job: TasksetImport) -> dict:
    return {
        "id": job.pk,
        "status": job.status,
        "finished": job.is_finished,
        "rows_done": job.rows_done,
        "bytes_done": job.bytes_done,
        "bytes_total": job.bytes_total,
        "percent": job.percent,
        "error": job.error,
        "taskset_url": reverse("taskset-detail", args=[job.taskset.name]) if job.taskset else None,
    }
