from django.contrib import messages
from django.http import HttpResponseNotFound
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, role_required
from apps.core.bidi import isolate
from apps.core.streaming import streaming
from apps.runs.api.tokens import token_or_session
from apps.runs.checkpoints import tar_stream
from apps.runs.models import Checkpoint, Run
from rftweb.errors import form_checks_nul

from . import evaluation, services
from .forms import SaveModelForm
from .models import SavedModel


@role_required(RESEARCHER)
def model_list(request):
    """The saved models with their lineage, the runs that load them (and how), and their eval
    scores as a leaderboard: ?sort=<eval taskset> puts the best on it first."""
    saved = list(SavedModel.objects.select_related("run", "created_by"))
    naming = services.runs_naming(saved)
    for model in saved:
        model.trained = [(run, services.model_uses(run, model)) for run in naming[model.pk]]
        model.deletable = services.may_delete(request.user, model)
    sort = request.GET.get("sort") or ""
    tasksets, ordered = evaluation.leaderboard(saved, evaluation.scores(saved, naming), sort)
    if sort and sort not in tasksets:  # a stale link (its scores' runs deleted) or a typo
        messages.error(request, f"No model has a score on {isolate(sort)} to sort by: the models are in the order "
                                "they were saved.")
    return render(request, "saved_models/list.html", {"models": ordered, "tasksets": tasksets,
                                                      "sort": sort if sort in tasksets else ""})


@form_checks_nul
@role_required(RESEARCHER)
def model_save(request, run, version):
    """Save a checkpoint as a model: any researcher may, as any may download one."""
    run = get_object_or_404(Run, pk=run)
    checkpoint = get_object_or_404(Checkpoint, run=run, version=version)
    form = SaveModelForm(request.POST or None, initial={"name": services.default_name(run, version)})
    if request.method == "POST" and form.is_valid():
        try:
            saved = services.save_model(run, version, form.cleaned_data["name"], request.user,
                                        form.cleaned_data["note"])
        except services.SaveError as err:
            form.add_error(err.key, str(err))
        else:
            messages.success(request, f"Saved v{version} of {isolate(run.name)} as {isolate(saved.name)}: a run "
                                      f"names it as model.path {isolate(saved.model_path)}.")
            return redirect("model-list")
    return render(request, "saved_models/save.html", {"form": form, "run": run, "checkpoint": checkpoint})


@require_POST
@role_required(RESEARCHER)
def model_delete(request, name):
    saved = SavedModel.objects.filter(name=name).first()
    if saved is None:  # deleted meanwhile, from another tab or by someone else: what was asked is done
        messages.info(request, f"Model {isolate(name)} was already deleted.")
        return redirect("model-list")
    try:
        services.delete_model(saved, request.user)
    except services.SaveError as err:
        messages.error(request, str(err))
    else:
        messages.success(request, f"Deleted {isolate(name)} and its files.")
    return redirect("model-list")


@token_or_session  # scripts download with their API token
@role_required(RESEARCHER)
def model_download(request, name):
    """The model's directory as a tar, streamed (as a checkpoint's)."""
    saved = SavedModel.objects.filter(name=name).first()
    if saved is None:  # Django's 404 page says nothing of what was missing; a script's curl shows this
        return HttpResponseNotFound(f"No saved model named {name} (deleted?)\n", content_type="text/plain")
    chunks, size = tar_stream(services.model_dir(saved), saved.name)
    response = streaming(chunks, content_type="application/x-tar")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename=f"{saved.name}.tar")
    return response
