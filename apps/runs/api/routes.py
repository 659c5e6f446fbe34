"""The routes of the JSON API (docs/api.md), on django-ninja: runs, their duties, metrics and
experiences; launch and control; the workers, and a curator's drain of one. Each is a thin call
into the services and queries of apps/runs; `schemas.py` and `worker_schemas.py` say what each
answers, `auth.py` who may call it."""

from functools import cache, wraps

from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from ninja import NinjaAPI, Query, Status, Swagger

from apps.accounts.roles import CURATOR, RESEARCHER, has_role, role_required
from apps.feedback import stats
from workers.rft.config import ConfigError

from .. import queries, services, waits, worker_detail
from ..capacity import DrainRefused, NoAnswer, NoSuchWorker, set_drain, shown_name
from ..controls import control_run
from ..forms import RolloutFilterForm, RunFilterForm
from ..models import MetricPoint, Run
from .auth import ApiError, BearerToken, Session, add_error_handlers
from .bodies import config_of, invalid, json_body, known_fields, known_query, name_of
from .bulk_flag import router as bulk_flag_router
from .judgements import with_judgements
from .paging import MAX_METRIC_POINTS, count_parameter, number_parameter, page_after, page_of
from .saved_models import router as models_router
from .schemas import (
    AnnotationOut,
    DutiesOut,
    ErrorOut,
    ExperienceFilters,
    ExperiencePage,
    Id,
    IndexOut,
    LaunchedOut,
    LaunchIn,
    MetricFilters,
    MetricsOut,
    ResumedOut,
    RunDetailOut,
    RunFilters,
    RunOut,
    RunPage,
    experience_json,
    run_json,
)
from .sweeps import router as sweeps_router
from .tasksets import router as tasksets_router
from .tokens import token_for
from .worker_schemas import DrainedOut, WorkerDetailOut, WorkersOut, workers_json


class RftwebAPI(NinjaAPI):
    """Ninja mounted without a URL namespace (apps/runs/api/__init__.py), so that `reverse("api-runs")`
    works as for every other URL of the site."""

    def get_root_path(self, path_params) -> str:
        return reverse("api-index")

    def get_content_type(self) -> str:
        return "application/json"  # as Django's JsonResponse says it, and the error answers do


class SchemaSwagger(Swagger):
    def get_openapi_url(self, api, path_params) -> str:
        return reverse("api-schema")


api = RftwebAPI(
    title="rftweb",
    version="1",
    description="Runs, their metrics and experiences; launch and control. See docs/api.md.",
    auth=[BearerToken(), Session()],  # in this order (auth.py)
    urls_namespace="api",
    # Served by the routes below, behind the API's own login and role checks.
    openapi_url=None,
    docs_url=None,
    docs=SchemaSwagger(),
)
add_error_handlers(api)


def reads_only_its_query(view_func):
    """Every route refuses the query parameters it does not read (bodies.known_query), after the
    auth checks (ninja applies an "operation" decorator to the view it calls once they passed).
    What a route reads: the fields of its Query[...] parameters, as /api/openapi.json lists them."""
    known = [name for model in view_func._ninja_operation.models if model.__ninja_param_source__ == "query"
             for name in model.__ninja_flatten_map__]

    @wraps(view_func)
    def checked(request, *args, **kwargs):
        known_query(request.GET, known)
        return view_func(request, *args, **kwargs)

    return checked


api.add_decorator(reads_only_its_query)  # before the routers: they inherit it
api.add_router("/tasksets/", tasksets_router)
api.add_router("/sweeps/", sweeps_router)
api.add_router("/models/", models_router)
api.add_router("/runs/", bulk_flag_router)  # /runs/<id>/bulk-flag/: apps/feedback's bulk flag

REFUSED = {401: ErrorOut, 403: ErrorOut}  # no token or session; not a researcher, or no CSRF token
RUN_REFUSED = {**REFUSED, 404: ErrorOut}  # no such run
CONTROL_REFUSED = {**RUN_REFUSED, 409: ErrorOut}  # not offered in the run's status


def _run(pk) -> Run:
    return get_object_or_404(queries.with_latest_explorer_metrics(Run.objects.select_related("owner")), pk=pk)


def _valid(form):
    if not form.is_valid():
        raise ApiError(400, "invalid filters", errors=form.errors)
    return form


@cache
def openapi_schema() -> dict:
    """The same for every request (no per-user parts), so built once per process."""
    return api.get_openapi_schema()


@never_cache  # the page holds the user's token, as /api/token/ does
@role_required(RESEARCHER)
def docs_page(request):
    """Swagger UI over /api/openapi.json under the site's own header, from ninja's static files (no
    CDN; the CSP allows scripts of this site only). "Try it out" sends the user's bearer token
    (static/js/api_docs.js), so the curl lines it shows run as they are in a terminal: through the
    session they carried an X-CSRFToken header that a script has no use for."""
    swagger = {**api.docs.settings, "url": reverse("api-schema")}
    return render(request, "runs/api_docs.html", {"swagger_settings": swagger, "token": token_for(request.user)})


@api.get("/", response={200: IndexOut, **REFUSED}, url_name="api-index", by_alias=True, summary="This index")
def index(request):
    """What a script finds at /api/: the live docs, the schema, where to get a token, and each path."""
    endpoints = {
        path: " · ".join(
            f"{method.upper()} {operation['summary']}" for method, operation in operations.items()
        )
        for path, operations in openapi_schema()["paths"].items()
    }
    return {
        "docs": request.build_absolute_uri(reverse("api-docs")),
        "schema": request.build_absolute_uri(reverse("api-schema")),
        "token": request.build_absolute_uri(reverse("api-token")),
        "endpoints": endpoints,
    }


@api.get("/openapi.json", include_in_schema=False, url_name="api-schema")
def schema(request):
    return openapi_schema()


@api.get("/runs/", response={200: RunPage, 400: ErrorOut, **REFUSED}, url_name="api-runs", summary="List runs")
def list_runs(request, filters: Query[RunFilters]):
    """Newest first."""
    form = _valid(RunFilterForm(filters.dict(exclude={"page", "page_size"}, exclude_none=True)))
    listed = form.filter(queries.with_latest_explorer_metrics(Run.objects.select_related("owner")))
    page = page_of(listed, filters.page, filters.page_size)
    return {**page, "results": [run_json(run) for run in page["results"]]}


@api.post(
    "/runs/", response={201: LaunchedOut, 400: ErrorOut, **REFUSED}, url_name="api-runs", summary="Launch a run",
    openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": LaunchIn.model_json_schema()}}
    }},
)
def launch_run(request):
    """201 with the run and `warnings`: what it will wait for given the workers' free slots."""
    body = json_body(request)
    known_fields(body, LaunchIn.model_fields)
    name = name_of(body, "api run")
    try:
        run = services.launch_run(request.user, name, config_of(body))
    except ConfigError as err:
        raise invalid(err) from None
    answer = run_json(_run(run.pk), detail=True)
    answer["warnings"] = waits.launch_warnings(run.config, run.pk)
    return Status(201, answer)


@api.get("/runs/{pk}/", response={200: RunDetailOut, **RUN_REFUSED}, url_name="api-run", summary="One run")
def run_detail(request, pk: Id):
    """With its config, duties, checkpoints and resumes."""
    return run_json(_run(pk), detail=True)


@api.get("/runs/{pk}/duties/", response={200: DutiesOut, **RUN_REFUSED}, url_name="api-run-duties",
         summary="A run's duties")
def run_duties(request, pk: Id):
    """Which worker serves each duty, or what each waits for (the run page polls it)."""
    return waits.duties_json(get_object_or_404(Run, pk=pk))


@api.get("/runs/{pk}/metrics/", response={200: MetricsOut, 400: ErrorOut, **RUN_REFUSED},
         url_name="api-run-metrics", summary="A run's metrics")
def run_metrics(request, pk: Id, filters: Query[MetricFilters]):
    """By role, in step order, at most `limit` points a role; `next_since` and `more` say how to go on."""
    run = get_object_or_404(Run, pk=pk)
    since, role = number_parameter(filters.since, "since", "a step number"), filters.role or None
    if role is not None and role not in MetricPoint.Role.values:
        raise ApiError(400, f"role must be one of: {', '.join(MetricPoint.Role.values)}")
    limit = count_parameter(filters.limit, "limit", cap=MAX_METRIC_POINTS, default=MAX_METRIC_POINTS)
    keys = [key.strip() for key in (filters.keys or "").split(",") if key.strip()]
    # One point more than asked says whether a role has more, without counting them.
    metrics = queries.metrics_by_role(run, role=role, since=since, keys=keys, limit=limit + 1)
    more = {each: len(points) > limit for each, points in metrics.items()}
    metrics = {each: points[:limit] for each, points in metrics.items()}
    # Per role: each has its own steps (the system role's are Unix seconds) and its own cap.
    next_since = {each: points[-1]["step"] for each, points in metrics.items()}
    return {"run": run.pk, "name": run.name, "metrics": metrics, "next_since": next_since, "more": more}


@api.get("/runs/{pk}/annotation/", response={200: AnnotationOut, **RUN_REFUSED}, url_name="api-run-annotation",
         summary="A run's annotation progress")
def run_annotation(request, pk: Id):
    """What the annotators did: judgements by kind and by annotator, and how far they agree."""
    run = get_object_or_404(Run, pk=pk)
    done = stats.summary(run)
    done.pop("human_reward_by_step")
    return {"run": run.pk, **done, "per_annotator": stats.per_annotator(run), "per_reviewer": stats.per_reviewer(run),
            "agreement": stats.agreement(run),
            "pairwise": stats.pairwise_agreement(run)}


@api.get("/runs/{pk}/experiences/", response={200: ExperiencePage, 400: ErrorOut, **RUN_REFUSED},
         url_name="api-run-experiences", summary="A run's rollouts")
def run_experiences(request, pk: Id, filters: Query[ExperienceFilters]):
    """The rollout browser's data and filters, newest step first; or, from `after_id` on, in id
    order: a cursor to poll a run that is writing."""
    run = get_object_or_404(Run, pk=pk)
    after_id = number_parameter(filters.after_id, "after_id", "an experience id (a whole number)")
    if after_id is not None and filters.page is not None:
        raise ApiError(400, "after_id is a cursor: send it without page (next_after_id moves it on)")
    form = _valid(RolloutFilterForm(filters.dict(exclude={"page", "page_size", "after_id"}, exclude_none=True)))
    experiences = with_judgements(queries.experiences_for_browsing(form.filter(run.experiences.all())))
    if after_id is not None:
        page = page_after(experiences, after_id, filters.page_size)
    else:
        newest = experiences.order_by("-explorer_step", "group_id", "rollout_index", "pk")
        page = {**page_of(newest, filters.page, filters.page_size), "next_after_id": None}
    return {**page, "results": [experience_json(e) for e in page["results"]]}


def _control(request, pk: int, action: str) -> tuple[Run, str]:
    """Apply the control; the run and the status it had. 409 (with the status) when not offered."""
    run = get_object_or_404(Run, pk=pk)
    was = run.status
    try:
        control_run(run, action, request.user)
    except services.InvalidTransition as err:  # the status as refused: another request may have moved it
        status = Run.objects.filter(pk=pk).values_list("status", flat=True).first() or run.status
        raise ApiError(409, str(err), status=status) from None
    return run, was


@api.post("/runs/{pk}/pause/", response={200: RunOut, **CONTROL_REFUSED}, url_name="api-run-pause",
          summary="Pause a run")
def pause_run(request, pk: Id):
    _control(request, pk, "pause")
    return run_json(_run(pk))


@api.post("/runs/{pk}/resume/", response={200: ResumedOut, **CONTROL_REFUSED}, url_name="api-run-resume",
          summary="Resume a run")
def resume_run(request, pk: Id):
    """A paused run carries on in place; a failed or stopped one is queued again and continues from
    its newest checkpoint. `message` says where from."""
    run, was = _control(request, pk, "resume")
    return {**run_json(_run(pk), detail=True), "message": services.describe_resume(run, was)}


@api.post("/runs/{pk}/stop/", response={200: RunOut, **CONTROL_REFUSED}, url_name="api-run-stop",
          summary="Stop a run")
def stop_run(request, pk: Id):
    _control(request, pk, "stop")
    return run_json(_run(pk))


@api.get("/workers/", response={200: WorkersOut, **REFUSED}, url_name="api-workers", summary="The workers")
def workers(request):
    """The live workers, what each holds, and those lost or stopped in the last day (the Workers page's data)."""
    return workers_json()


def _drain(request, name: str, drain: bool) -> dict:
    """A curator drains or undrains a worker, as on its page (capacity.set_drain): 200 with its
    page's data and `message`; 404 for a name no worker registered, 409 for one not live (or the
    embedded server's threads), 503 when it did not answer within 3 s, nothing changed."""
    if not has_role(request.user, CURATOR):
        raise ApiError(403, f"only a curator may {'drain' if drain else 'undrain'} a worker")
    try:
        set_drain(name, request.user.get_username(), drain)
    except NoSuchWorker as err:
        raise ApiError(404, str(err)) from None
    except NoAnswer as err:
        raise ApiError(503, str(err)) from None
    except DrainRefused as err:
        raise ApiError(409, str(err)) from None
    said = (f"draining {name}: it finishes what it holds and takes no new duty" if drain
            else f"{name} takes duties again")
    return {**worker_detail.detail(name), "message": said}


DRAIN_REFUSED = {**REFUSED, 404: ErrorOut, 409: ErrorOut, 503: ErrorOut}


# Before "One worker": its path takes any name, "/" too, so it would take these paths first.
@api.post("/workers/{path:name}/drain/", response={200: DrainedOut, **DRAIN_REFUSED}, url_name="api-worker-drain",
          summary="Drain a worker")
def drain_worker(request, name: str):
    """It finishes the duties it holds and takes no new one (it stops consuming its queues) until
    undrained or restarted. Curators only."""
    return _drain(request, name, True)


@api.post("/workers/{path:name}/undrain/", response={200: DrainedOut, **DRAIN_REFUSED},
          url_name="api-worker-undrain", summary="Undrain a worker")
def undrain_worker(request, name: str):
    """It consumes its queues again. Curators only."""
    return _drain(request, name, False)


@api.get("/workers/{path:name}/", response={200: WorkerDetailOut, **RUN_REFUSED}, url_name="api-worker",
         summary="One worker")
def worker(request, name: str):
    """What it holds, the duties it held in the last day and how each ended, and its log's tail (its page's data)."""
    if (shown := worker_detail.detail(name)) is None:
        raise Http404(f"no worker named {shown_name(name)} was seen in the last day")
    return shown
