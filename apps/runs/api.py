"""The JSON API under /api/ (docs/api.md): runs, their metrics and experiences; launch and control.

Pages call it with their session; scripts with `Authorization: Bearer <token>`. A token is the
user's id and an HMAC of it with the user's password hash under SECRET_KEY, so it needs no table,
cannot be forged, and dies when the password changes (which is how a user revokes it). API clients
get 401/403 as JSON, never the login page.
"""

import json
import re
from functools import wraps

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.paginator import Paginator
from django.http import Http404, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.crypto import constant_time_compare, salted_hmac
from django.views.decorators.csrf import csrf_exempt

from apps.accounts.roles import RESEARCHER, has_role
from workers.rft.config import ConfigError, ConfigIssue, parse_config_text
from workers.rft.json_values import text_problem

from . import capacity, queries, services
from .controls import control_run
from .forms import RolloutFilterForm, RunFilterForm
from .models import MetricPoint, Run

TOKEN_PREFIX = "rft"
TOKEN_SALT = "apps.runs.api.token"
PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


# The one spelling of a token, as token_for writes it: ASCII digits without leading zeros (so
# `rft_04_...` is not a second spelling of `rft_4_...`, and `rft_²_...` or a 5,000-digit id never
# reaches int() or the database), then the hex HMAC.
TOKEN_FORMAT = re.compile(rf"{TOKEN_PREFIX}_([1-9][0-9]{{0,17}})_([0-9a-f]{{64}})")


def token_for(user) -> str:
    return f"{TOKEN_PREFIX}_{user.pk}_{_token_mac(user)}"


def _token_mac(user) -> str:
    return salted_hmac(TOKEN_SALT, f"{user.pk}:{user.password}", algorithm="sha256").hexdigest()


def user_for_token(token: str):
    """The active user the token belongs to, or None."""
    match = TOKEN_FORMAT.fullmatch(token)
    if match is None:
        return None
    user_id, mac = match.groups()
    user = get_user_model().objects.filter(pk=int(user_id), is_active=True).first()
    if user is None or not constant_time_compare(mac, _token_mac(user)):
        return None
    return user


def bearer_user(request):
    """The user of the request's `Authorization: Bearer <token>` header, or None when it names none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return user_for_token(token.strip()) if scheme.lower() == "bearer" else None


def authenticate_bearer(request) -> JsonResponse | None:
    """The Authorization header's user becomes request.user; a 401 when it names none."""
    user = bearer_user(request)
    if user is None:
        return error(401, "invalid API token")
    request.user = user
    return None


def token_or_session(view):
    """For a page that scripts fetch too (a checkpoint download): with an Authorization header its
    token's user, as on the API (a 401 if it names none); without one, the session, as on every
    page (anonymous users go to the login page)."""

    @login_not_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.headers.get("Authorization"):
            if refused := authenticate_bearer(request):
                return refused
        elif not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapped


def error(http_status: int, message: str, **extra) -> JsonResponse:
    response = JsonResponse({"error": message, **extra}, status=http_status)
    if http_status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="rftweb"'
    return response


def api_view(*methods: str):
    """A JSON endpoint for researchers: token or session auth (a session must pass the CSRF check
    to change anything), errors as JSON."""

    def decorator(view):
        @login_not_required
        @csrf_exempt
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if request.method not in methods:
                return error(405, f"use {' or '.join(methods)}")
            if request.headers.get("Authorization"):
                if refused := authenticate_bearer(request):
                    return refused
            elif not request.user.is_authenticated:
                return error(401, "log in, or send Authorization: Bearer <token>")
            elif request.method not in SAFE_METHODS and _csrf_failure(request):
                return error(403, "CSRF check failed; send the X-CSRFToken header")
            if not has_role(request.user, RESEARCHER):
                return error(403, f"the API needs the {RESEARCHER} role")
            try:
                return view(request, *args, **kwargs)
            except Http404 as err:
                return error(404, str(err) or "not found")
            except PermissionDenied as err:
                return error(403, str(err) or "forbidden")

        return wrapped

    return decorator


def _csrf_failure(request) -> bool:
    check = CsrfViewMiddleware(lambda request: None)
    check.process_request(request)
    return check.process_view(request, None, (), {}) is not None


def _json_body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except RequestDataTooBig:
        raise ValueError(f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes") from None
    except (ValueError, RecursionError):  # ValueError: not JSON, not UTF-8, an int of 5,000 digits
        raise ValueError("the body must be JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def _page(request, items):
    try:
        size = min(max(int(request.GET.get("page_size", PAGE_SIZE)), 1), MAX_PAGE_SIZE)
    except ValueError:
        size = PAGE_SIZE
    page = Paginator(items, size).get_page(request.GET.get("page"))
    return page, {"count": page.paginator.count, "page": page.number, "pages": page.paginator.num_pages}


def run_json(run: Run, *, detail: bool = False) -> dict:
    progress = queries.run_progress(run)
    data = {
        "id": run.pk,
        "name": run.name,
        "owner": run.owner.username,
        "status": run.status,
        "shown_status": capacity.shown_status(run),
        "mode": run.mode,
        "explorer_step": run.explorer_step,
        "trainer_step": run.trainer_step,
        "model_version": run.model_version,
        "total_steps": progress.total,
        "progress": progress.fraction,
        "latest_reward": queries.latest_reward(run),
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "url": reverse("run-detail", args=[run.pk]),
    }
    if detail:
        data["duties"] = capacity.duties_json(run)["duties"]
        data["config"] = run.config
        data["resumes"] = run.resumes
        data["checkpoints"] = [
            {
                "version": checkpoint.version,
                "step": checkpoint.step,
                "created_at": checkpoint.created_at,
                "download_url": reverse("checkpoint-download", args=[run.pk, checkpoint.version]),
            }
            for checkpoint in run.checkpoints.order_by("version")
        ]
    return data


def experience_json(experience) -> dict:
    return {
        "id": experience.pk,
        "explorer_step": experience.explorer_step,
        "group_id": experience.group_id,
        "rollout_index": experience.rollout_index,
        "source": experience.source,
        "status": experience.status,
        "prompt": experience.prompt_text,
        "response": experience.response_text,
        "reward": experience.reward,
        "reward_components": experience.reward_components,
        "advantage": experience.advantage,
        "model_version": experience.model_version,
        "response_tokens": queries.response_tokens(experience),
        "task_id": experience.task_id,
        "annotate_url": f"/annotate/experience/{experience.pk}/",
    }


def _run(pk) -> Run:
    return get_object_or_404(queries.with_latest_explorer_metrics(Run.objects.select_related("owner")), pk=pk)


@api_view("GET")
def index(request):
    """What a script finds at /api/: the endpoints, with the docs' name for each."""
    run = "<id>"
    return JsonResponse({
        "docs": "docs/api.md",
        "token": request.build_absolute_uri(reverse("api-token")),
        "endpoints": {
            "runs": "GET list (filters: q, status, owner, page, page_size) · POST launch {name, config}",
            f"runs/{run}/": "GET one run",
            f"runs/{run}/duties/": "GET its duties: which worker serves each, or what each waits for",
            f"runs/{run}/metrics/": "GET its metrics by role (role, since)",
            f"runs/{run}/experiences/": "GET its rollouts (filters as the rollout browser)",
            **{f"runs/{run}/{action}/": f"POST {action}" for action in ("pause", "resume", "stop")},
            "workers/": "GET the live workers, what each holds, and those lost or stopped in the last day",
        },
    })


def workers_json(overview: dict) -> dict:
    return {
        "embedded": settings.RFTWEB_EMBEDDED,
        "heartbeat_timeout_s": settings.RFTWEB_HEARTBEAT_TIMEOUT,
        **{section: [worker.as_json() for worker in workers] for section, workers in overview.items()},
    }


@api_view("GET")
def workers(request):
    """The workers as the Workers page shows them (apps/runs/capacity.py)."""
    return JsonResponse(workers_json(capacity.overview()))


@api_view("GET", "POST")
def runs(request):
    if request.method == "POST":
        return _launch(request)
    filters = RunFilterForm(request.GET)
    if not filters.is_valid():
        return error(400, "invalid filters", errors=filters.errors)
    listed = filters.filter(queries.with_latest_explorer_metrics(Run.objects.select_related("owner")))
    page, info = _page(request, listed)
    return JsonResponse({**info, "results": [run_json(run) for run in page]})


def _launch(request):
    """Body: {"name": "...", "config": {...} or "YAML text"}."""
    try:
        body = _json_body(request)
    except ValueError as err:
        return error(400, str(err))
    name = body.get("name") or "api run"
    problem = "must be a string" if not isinstance(name, str) else text_problem(name)
    if problem:  # JSON can carry "\u0000" or "\ud800", which Postgres cannot store
        return error(400, f"name {problem}", errors=[{"key": "name", "message": problem}])
    config = body.get("config") or {}
    try:
        if isinstance(config, str):
            config = parse_config_text(config)
        if not isinstance(config, dict):
            raise ConfigError([ConfigIssue("<config>", "expected a mapping or YAML text")])
        run = services.launch_run(request.user, name[:200], config)
    except ConfigError as err:
        return _config_errors([(issue.key, issue.message) for issue in err.errors])
    answer = run_json(_run(run.pk), detail=True)
    answer["warnings"] = capacity.launch_warnings(run.config, run.pk)  # what it will wait for (docs/api.md)
    return JsonResponse(answer, status=201)


def _config_errors(issues) -> JsonResponse:
    return error(400, "invalid config", errors=[{"key": key, "message": message} for key, message in issues])


@api_view("GET")
def run_detail(request, pk):
    return JsonResponse(run_json(_run(pk), detail=True))


@api_view("GET")
def run_duties(request, pk):
    """Each duty of the run and where it stands (capacity.duty_states); the run page polls it."""
    return JsonResponse(capacity.duties_json(get_object_or_404(Run, pk=pk)))


@api_view("POST")
def run_action(request, pk, action):
    """Pause, resume or stop; resuming a failed or stopped run says where it continues from."""
    run = get_object_or_404(Run, pk=pk)
    was = run.status
    try:
        control_run(run, action, request.user)
    except services.InvalidTransition as err:
        return error(409, str(err), status=run.status)
    data = run_json(_run(pk), detail=action == "resume")
    if action == "resume":
        data["message"] = services.describe_resume(run, was)
    return JsonResponse(data)


@api_view("GET")
def run_metrics(request, pk):
    """?role=trainer to keep one role, ?since=<step> for the steps after it (polling)."""
    run = get_object_or_404(Run, pk=pk)
    since, role = request.GET.get("since"), request.GET.get("role") or None
    if since is not None and not (since.isascii() and since.isdigit()):  # isdigit() alone takes "²"
        return error(400, "since must be a step number")
    if role is not None and role not in MetricPoint.Role.values:
        return error(400, f"role must be one of: {', '.join(MetricPoint.Role.values)}")
    metrics = queries.metrics_by_role(run, role=role, since=None if since is None else int(since))
    return JsonResponse({"run": run.pk, "name": run.name, "metrics": metrics})


@api_view("GET")
def run_experiences(request, pk):
    """The rollout browser's filters: ?step= &min_reward= &max_reward= &source= &q=, paginated."""
    run = get_object_or_404(Run, pk=pk)
    filters = RolloutFilterForm(request.GET)
    if not filters.is_valid():
        return error(400, "invalid filters", errors=filters.errors)
    experiences = queries.experiences_for_browsing(filters.filter(run.experiences.all())).order_by(
        "-explorer_step", "group_id", "rollout_index", "pk"
    )
    page, info = _page(request, experiences)
    return JsonResponse({**info, "results": [experience_json(e) for e in page]})
