from django.contrib import messages
from django.http import Http404, HttpResponseNotFound
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
from . import naming as naming_services
from .directories import renamed_from
from .forms import AliasForm, RenameForm, SaveModelForm
from .models import ModelAlias, SavedModel


def _annotated(saved: list[SavedModel], user, sort: str = "") -> tuple[list[str], list[SavedModel]]:
    """The list's and the model page's rows: each model with the runs that load it (and how), its
    aliases, whether `user` may change it, and its scores and unfinished bench runs per eval taskset
    (evaluation.leaderboard)."""
    naming = services.runs_naming(saved)
    aliases = naming_services.aliases_of(saved)
    for model in saved:
        model.trained = [(run, services.model_uses(run, model)) for run in naming[model.pk]]
        model.changeable = services.may_change(user, model)
        model.alias_names = aliases[model.pk]
    return evaluation.leaderboard(saved, evaluation.scores(saved, naming), sort, evaluation.pending(saved, naming))


@role_required(RESEARCHER)
def model_list(request):
    """The saved models with their lineage, the runs that load them (and how), and their eval
    scores as a leaderboard: ?sort=<eval taskset> puts the best on it first, ?alias=<alias> shows
    the models that carry it (one per owner)."""
    saved = SavedModel.objects.select_related("run", "created_by")
    alias = request.GET.get("alias") or ""
    if alias:
        saved = saved.filter(aliases__name=alias)
    saved = list(saved)
    sort = request.GET.get("sort") or ""
    tasksets, ordered = _annotated(saved, request.user, sort)
    if sort and sort not in tasksets:  # a stale link (its scores' runs deleted) or a typo
        messages.error(request, f"No model has a score on {isolate(sort)} to sort by: the models are in the order "
                                "they were saved.")
    return render(request, "saved_models/list.html", {
        "models": ordered, "tasksets": tasksets, "sort": sort if sort in tasksets else "", "alias": alias,
        "all_aliases": sorted(set(ModelAlias.objects.values_list("name", flat=True)))})


def _model_or_redirect(request, name):
    """(the model named `name`, None), or (None, a response): a redirect to its new name where
    `name` was a former one (a bookmark from before a rename), else a 404 naming it."""
    saved = SavedModel.objects.select_related("run", "created_by").filter(name=name).first()
    if saved is not None:
        return saved, None
    renamed = renamed_from(name)
    if renamed is not None:
        messages.info(request, f"{isolate(name)} was renamed {isolate(renamed.name)}.")
        return None, redirect("model-detail", name=renamed.name)
    raise Http404(f"No saved model named {name} (deleted or renamed?)")


@role_required(RESEARCHER)
def model_detail(request, name):
    """One model, as MLflow's registered model page: its lineage, aliases, scores per eval
    taskset (with its unfinished bench runs), the runs that load it, and for who may change it
    the rename and alias forms."""
    saved, elsewhere = _model_or_redirect(request, name)
    if elsewhere:
        return elsewhere
    tasksets, _ = _annotated([saved], request.user)
    saved.scored_cells = list(zip(tasksets, saved.cells))
    return render(request, "saved_models/detail.html", {
        "model": saved, "tasksets": tasksets, "rename_form": RenameForm(initial={"name": saved.name}),
        "alias_form": AliasForm()})


def _changed(request, name):
    """The model to change by a POST (who may is the service's to check), or None, said, where it
    is gone: the view then goes back to the list."""
    saved = SavedModel.objects.select_related("created_by").filter(name=name).first()
    if saved is None:
        messages.error(request, f"No saved model named {isolate(name)}: deleted or renamed meanwhile.")
    return saved


@form_checks_nul
@require_POST
@role_required(RESEARCHER)
def model_rename(request, name):
    saved = SavedModel.objects.select_related("created_by").filter(name=name).first()
    if saved is None:  # renamed (or deleted) by someone else since the form was drawn
        return _gone(request, name)
    try:
        naming_services.rename_model(saved, request.POST.get("name", ""), request.user)
    except services.SaveError as err:
        messages.error(request, f"Not renamed: {err}")
        now = SavedModel.objects.filter(pk=saved.pk).values_list("name", flat=True).first()
        return redirect("model-detail", name=now) if now else redirect("model-list")
    if saved.name == name:  # its own name: the service changed nothing
        messages.info(request, f"{isolate(name)} is its name already: nothing renamed.")
        return redirect("model-detail", name=name)
    loaded = any(str(services.models_root() / name) in services.strings(run.config)
                 for run in services.runs_naming([saved])[saved.pk])
    still = (f"; the runs that loaded it as models/{isolate(name)} are still listed as trained from it"
             if loaded else "")
    messages.success(request, f"Renamed {isolate(name)} to {isolate(saved.name)}: a run names it as model.path "
                              f"{isolate(saved.model_path)} now{still}.")
    return redirect("model-detail", name=saved.name)


def _gone(request, name):
    """Back to the model's page under its new name where another renamed it, said; else the list."""
    renamed = renamed_from(name)
    if renamed is None:
        messages.error(request, f"Not renamed: no saved model named {isolate(name)} (deleted meanwhile?).")
        return redirect("model-list")
    messages.error(request, f"Not renamed: {isolate(name)} was renamed meanwhile to {isolate(renamed.name)}.")
    return redirect("model-detail", name=renamed.name)


@form_checks_nul
@require_POST
@role_required(RESEARCHER)
def model_alias(request, name):
    """Set (alias=) or take off (remove=) one of the model's aliases."""
    saved = _changed(request, name)
    if saved is None:
        return redirect("model-list")
    removed = request.POST.get("remove")
    if removed is not None:
        if naming_services.remove_alias(saved, removed, request.user):
            messages.success(request, f"{isolate(saved.name)} is no longer {isolate(removed)}.")
        else:
            messages.info(request, f"{isolate(saved.name)} was not {isolate(removed)} (taken off meanwhile?).")
        return redirect("model-detail", name=name)
    alias = (request.POST.get("alias") or "").strip()
    try:
        moved_from = naming_services.set_alias(saved, alias, request.user)
    except services.SaveError as err:
        messages.error(request, f"No alias set: {err}")
    else:
        moved = f", moved from {isolate(moved_from.name)}, which is no longer {alias}" if moved_from else ""
        messages.success(request, f"{isolate(saved.name)} is {alias} now{moved}.")
    return redirect("model-detail", name=name)


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
