from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Sum
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, role_required
from apps.core.bidi import isolate
from apps.core.jobs import JobError, cancel_job, cancellable, label, visible_job
from rftweb.errors import form_checks_nul

from . import services, staging
from .forms import TasksetUploadForm
from .models import TaskDraw, Taskset, TasksetImport

RECENT_IMPORTS = 5


@role_required(RESEARCHER)
def taskset_list(request):
    imports = TasksetImport.objects.filter(created_by=request.user).select_related("taskset")[:RECENT_IMPORTS]
    return render(request, "tasksets/list.html", {"tasksets": Taskset.objects.all(), "imports": imports})


@role_required(RESEARCHER)
def taskset_detail(request, name):
    taskset = get_object_or_404(Taskset, name=name)
    page = Paginator(taskset.own_tasks.order_by("index"), 50).get_page(request.GET.get("page"))
    drawn = dict(TaskDraw.objects.filter(task__in=list(page)).values("task").annotate(n=Sum("count"))
                 .values_list("task", "n"))
    for task in page:
        task.drawn = drawn.get(task.pk, 0)  # by every run
    # An upload that mapped no difficulty column holds 0 for every task: no column of 0.00 then.
    # A built-in generator's tasks (no mapping) have their own.
    mapping = taskset.field_mapping or {}
    shows_difficulty = not mapping or bool(mapping.get("difficulty"))
    return render(request, "tasksets/detail.html", {"taskset": taskset, "page": page,
                                                     "shows_difficulty": shows_difficulty})


@form_checks_nul
@role_required(RESEARCHER)
def taskset_upload(request):
    form = TasksetUploadForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        job = services.start_taskset_import(
            upload=form.upload,
            name=data["name"],
            fmt=data["format"],
            mapping=form.mapping,
            description=data["description"],
            default_workflow=data["default_workflow"],
            default_reward_fn=data["default_reward_fn"],
            user=request.user,
        )
        if form.kept:
            form.kept.discard()  # the job has its own copy
        return redirect("taskset-import", pk=job.pk)
    kept = form.kept
    if form.is_bound and form.cleaned_data.get("file"):  # a good file, with an error elsewhere: keep it
        try:
            kept = staging.keep(form.cleaned_data["file"], request.user, replacing=request.POST.get("staged", ""))
        except staging.NotKept as refused:
            form.add_error("file", str(refused))
    return render(request, "tasksets/upload.html", {"form": form, "kept": kept})


@role_required(RESEARCHER)
def taskset_import(request, pk):
    """An import job's page, with its progress (apps.core's progress widget) until it has finished."""
    job = _visible_import(request, pk)
    may_cancel = cancellable(job) and job.may_cancel(request.user)
    return render(request, "tasksets/import.html", {"job": job, "job_label": label(job), "may_cancel": may_cancel})


@require_POST
@role_required(RESEARCHER)
def taskset_import_cancel(request, pk):
    """Its uploader's (or a curator's) Cancel: the import rolls back at its next batch."""
    job = _visible_import(request, pk)
    if not job.may_cancel(request.user):
        messages.error(request, "Only the researcher who uploaded the file, or a curator, may cancel its import.")
    else:
        try:
            job = cancel_job(job)
        except JobError as exc:
            messages.error(request, str(exc))
        else:
            done = "cancelled" if job.is_finished else "stops after its current batch of rows and rolls back"
            messages.success(request, f"Import of {isolate(job.original_filename)} {done}: "
                                      f"no taskset {isolate(job.name)} is made.")
    return redirect("taskset-import", pk=job.pk)


def _visible_import(request, pk) -> TasksetImport:
    # Another user's import answers as a missing one (404, not 403): job ids cannot be probed.
    job = visible_job("tasksets.tasksetimport", pk, request.user)
    if job is None:
        raise Http404("no such import")
    return job
