"""The API's saved models (apps/saved_models): list them (by alias too) or get one, save a run's checkpoint as
one, rename one, set and take off its aliases, delete one. The Models page's actions, through the
same services and the same checks."""
from datetime import datetime
from urllib.parse import urlencode

from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Field, Query, Router, Schema, Status

from apps.saved_models import evaluation, naming, services
from apps.saved_models.directories import renamed_from
from apps.saved_models.models import MAX_NOTE, ModelAlias, SavedModel
from workers.rft.json_values import text_problem

from ..models import Run
from .auth import ApiError
from .bodies import json_body, known_fields
from .paging import page_of
from .schemas import PAGE, PAGE_SIZE, ErrorOut

router = Router(tags=["models"])
REFUSED = {401: ErrorOut, 403: ErrorOut}


class Listing(Schema):
    page: str | None = PAGE
    page_size: str | None = PAGE_SIZE
    alias: str | None = Field(None, description="only the models that carry this alias (one per owner)")


class RenameIn(Schema):
    name: str = Field(description="its new name: letters, digits, '.', '_' and '-', not another model's in any case")


class AliasIn(Schema):
    alias: str = Field(description=f"1 to {ModelAlias.MAX_NAME} lower-case letters, digits, '_' and '-' (champion)")


class AliasOut(Schema):
    model: str
    alias: str
    moved_from: str | None = Field(description="the owner's model that carried it until now, if one did")


class SaveIn(Schema):
    run: int = Field(description="the run's id")
    version: int = Field(description="its checkpoint's version (the run page's Checkpoints table, v12: 12)")
    name: str | None = Field(None, description="letters, digits, '.', '_' and '-'; default <run>-<id>-v<version>")
    note: str | None = Field(None, description=f"at most {MAX_NOTE} characters")


class ScoreOut(Schema):
    eval_taskset: str
    metric: str = Field(description="the eval key: an accuracy (exact_match, accuracy, ...) where the reward fn "
                                    "scores 1 or 0, else the mean eval reward (reward_mean)")
    value: float
    run: int = Field(description="the run that recorded it")
    run_name: str
    step: int
    source: str = Field(description="bench: a finished mode-bench run of the model; at save: its source run's own "
                                    "eval at the checkpoint's step")


class UseOut(Schema):
    run: int
    name: str
    status: str
    uses: list[str] = Field(description="how it loads the model: policy, evaluated (mode bench), reference, critic, "
                                        "reward model")


class ModelOut(Schema):
    name: str
    aliases: list[str] = Field(description="its labels (champion, challenger), each unique among its saver's models")
    former_names: list[str] = Field(description="its names before renames, oldest first: runs that loaded it then "
                                                "name it so")
    model_path: str = Field(description="what a run's config names it by: model.path: models/<name>")
    run: int | None = Field(description="the run it was saved from (null once that run is deleted)")
    run_name: str
    checkpoint_version: int
    step: int
    size_bytes: int
    note: str
    created_by: str | None
    created_at: datetime
    trained_from_it: list[int] = Field(description="the runs that load it: as their model.path, ref_path, "
                                                   "critic_path or a reward model")
    runs: list[UseOut] = Field(description="those runs, each with its status and how it loads the model")
    scores: list[ScoreOut] = Field(description="its eval scores: each finished bench run's, newest first, then its "
                                               "source run's at the checkpoint's step where it evaluated then")
    evaluate_url: str = Field(description="the launch form on a mode bench run of it (the Models page's Evaluate)")
    download_url: str


class ModelPage(Schema):
    count: int
    page: int
    pages: int
    results: list[ModelOut]


def model_json(saved: SavedModel, trained: list[Run], scores: list, aliases: list[str]) -> dict:
    return {"name": saved.name, "aliases": aliases, "former_names": saved.former_names,
            "model_path": saved.model_path, "run": saved.run_id, "run_name": saved.run_name,
            "checkpoint_version": saved.checkpoint_version, "step": saved.step, "size_bytes": saved.size_bytes,
            "note": saved.note, "created_by": saved.created_by.username if saved.created_by else None,
            "created_at": saved.created_at, "trained_from_it": [run.pk for run in trained],
            "runs": [{"run": run.pk, "name": run.name, "status": run.status, "uses": services.model_uses(run, saved)}
                     for run in trained],
            "scores": [score.as_json() for score in scores],
            "evaluate_url": f"{reverse('run-launch')}?{urlencode({'evaluate': saved.name})}",
            "download_url": reverse("model-download", args=[saved.name])}


@router.get("/", response={200: ModelPage, 400: ErrorOut, **REFUSED}, url_name="api-models",
            summary="List saved models")
def list_models(request, query: Query[Listing]):
    """Newest first, each with its aliases, the runs that load it (and how) and its eval scores;
    ?alias= the models that carry one."""
    models = SavedModel.objects.select_related("run", "created_by")
    if query.alias is not None:
        models = models.filter(aliases__name=query.alias)
    page = page_of(models, query.page, query.page_size)
    saved = list(page["results"])
    return {**page, "results": described(saved)}


def described(saved: list[SavedModel]) -> list[dict]:
    trained = services.runs_naming(saved)
    scores = evaluation.scores(saved, trained)
    aliases = naming.aliases_of(saved)
    return [model_json(model, trained[model.pk], scores[model.pk], aliases[model.pk]) for model in saved]


def _named(name: str) -> SavedModel:
    saved = SavedModel.objects.select_related("run", "created_by").filter(name=name).first()
    if saved is None:
        renamed = renamed_from(name)
        raise ApiError(404, f"no saved model named {name} (renamed to {renamed.name})" if renamed else
                       f"no saved model named {name} (deleted?)")
    return saved


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"{key} must be a string", errors=[{"key": key, "message": "a string"}])
    if problem := text_problem(value):
        raise ApiError(400, f"{key} {problem}", errors=[{"key": key, "message": problem}])
    return value


@router.post(
    "/{name}/aliases/", response={200: AliasOut, 400: ErrorOut, 404: ErrorOut, **REFUSED},
    url_name="api-model-aliases", summary="Set an alias on a saved model",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": AliasIn.model_json_schema()}}}},
)
def set_alias(request, name: str):
    """200 once the model carries it, and which of its saver's models lost it (moved_from). 403
    for anyone but who saved it or a curator; 400 names a bad alias, or one it carries already."""
    saved = _named(name)
    naming.check_may_change(request.user, saved, "alias")
    body = json_body(request)
    known_fields(body, AliasIn.model_fields)
    alias = _text(body, "alias")
    try:
        moved_from = naming.set_alias(saved, alias, request.user)
    except services.SaveError as err:
        raise ApiError(400, str(err), errors=[{"key": "alias", "message": str(err)}]) from None
    return {"model": saved.name, "alias": alias.strip(), "moved_from": moved_from.name if moved_from else None}


@router.delete("/{name}/aliases/{alias}/", response={204: None, 404: ErrorOut, **REFUSED},
               url_name="api-model-alias", summary="Take an alias off a saved model")
def remove_alias(request, name: str, alias: str):
    """204 once it no longer carries it; 404 if it did not. 403 for anyone but who saved it or a curator."""
    if not naming.remove_alias(_named(name), alias, request.user):
        raise ApiError(404, f"{name} is not {alias}")
    return Status(204, None)


@router.post(
    "/", response={201: ModelOut, 400: ErrorOut, 404: ErrorOut, **REFUSED}, url_name="api-models",
    summary="Save a run's checkpoint as a model",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": SaveIn.model_json_schema()}}}},
)
def save_model(request):
    """201 with the model. 400 names the problem (a bad or taken name, a checkpoint deleted by its
    run's keep_checkpoints); nothing is saved then."""
    body = json_body(request)
    known_fields(body, SaveIn.model_fields)
    for key in ("run", "version"):
        if not isinstance(body.get(key), int) or isinstance(body.get(key), bool) or body[key] < 0:
            raise ApiError(400, f"{key} must be a whole number", errors=[{"key": key, "message": "a whole number"}])
    for key in ("name", "note"):
        value = body.get(key)
        problem = None if value is None else "must be a string" if not isinstance(value, str) else text_problem(value)
        if problem:
            raise ApiError(400, f"{key} {problem}", errors=[{"key": key, "message": problem}])
    run = get_object_or_404(Run, pk=body["run"])
    name = body.get("name") or services.default_name(run, body["version"])
    if not run.checkpoints.filter(version=body["version"]).exists():
        raise ApiError(404, f"run {run.name} has no checkpoint v{body['version']}")
    try:
        saved = services.save_model(run, body["version"], name, request.user, body.get("note") or "")
    except services.SaveError as err:
        raise ApiError(400, str(err), errors=[{"key": err.key, "message": str(err)}]) from None
    return Status(201, model_json(saved, [], [], []))


@router.get("/{name}/", response={200: ModelOut, 404: ErrorOut, **REFUSED}, url_name="api-model",
            summary="Get a saved model")
def get_model(request, name: str):
    """The model, as the list gives it. 404 for no model of that name (one renamed says its new
    name: no redirect, so a client sees that its name is out of date)."""
    return described([_named(name)])[0]


@router.patch(
    "/{name}/", response={200: ModelOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut, **REFUSED},
    url_name="api-model", summary="Rename a saved model",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": RenameIn.model_json_schema()}}}},
)
def rename_model(request, name: str):
    """200 with the model under its new name (and directory, models/<new name>). 403 for anyone but
    who saved it or a curator; 400 names a bad or taken name; 409 while a run that may still load
    it names its directory (queued, training, or stopped or failed: a resume loads it again), or
    when another rename or a deletion came first (renamed meanwhile to ...)."""
    saved = _named(name)
    naming.check_may_change(request.user, saved, "rename")  # a 403 before anything the body holds
    body = json_body(request)
    known_fields(body, RenameIn.model_fields)
    new = _text(body, "name")
    try:
        naming.rename_model(saved, new, request.user)
    except services.SaveError as err:
        if err.conflict:
            raise ApiError(409, str(err)) from None
        raise ApiError(400, str(err), errors=[{"key": "name", "message": str(err)}]) from None
    return described([saved])[0]


@router.delete("/{name}/", response={204: None, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, **REFUSED},
               url_name="api-model", summary="Delete a saved model")
def delete_model(request, name: str):
    """204 once it and its files are gone. 403 for anyone but who saved it or a curator; 409 while
    a run that may still load it names it (queued, training, or stopped or failed: a resume loads
    it again)."""
    saved = SavedModel.objects.filter(name=name).first()
    if saved is None:
        raise ApiError(404, f"no saved model named {name} (already deleted?)")
    try:
        services.delete_model(saved, request.user)
    except services.SaveError as err:
        raise ApiError(409, str(err)) from None
    return Status(204, None)
