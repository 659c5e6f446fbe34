"""Who may call the API, and the shape of every refusal.

A request with an `Authorization` header is a script's: its token alone decides (a wrong one is a
401, whatever cookie comes with it). Without one, the login session, as the pages call it; a
session must pass the CSRF check to change anything (a token needs none: there is no cookie to
ride on). Either way the user needs the researcher role. Failures are `{"error": ...}` JSON, never
the login page."""

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from ninja.errors import AuthenticationError, ValidationError
from ninja.security.base import AuthBase
from ninja.utils import check_csrf

from apps.accounts.roles import RESEARCHER, has_role

from .tokens import CHALLENGE, INVALID_TOKEN, bearer_user

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class ApiError(Exception):
    """Answered as `{"error": message, **extra}` with the status (apps/runs/api/routes.py raises it)."""

    def __init__(self, http_status: int, message: str, **extra):
        super().__init__(message)
        self.http_status, self.message, self.extra = http_status, message, extra


def error(http_status: int, message: str, **extra) -> JsonResponse:
    challenge = CHALLENGE if http_status == 401 else None
    return JsonResponse({"error": message, **extra}, status=http_status, headers=challenge)


def _researcher(user):
    if not has_role(user, RESEARCHER):
        raise ApiError(403, f"the API needs the {RESEARCHER} role")
    return user


class BearerToken(AuthBase):
    """The API's first auth: with an Authorization header it decides, raising on a bad token, so
    the session is only tried without one."""

    openapi_type = "http"
    openapi_scheme = "bearer"
    openapi_description = "A researcher's token, from /api/token/: `Authorization: Bearer rft_...`"

    def __call__(self, request):
        if not request.headers.get("Authorization"):
            return None  # the session's turn
        user = bearer_user(request)
        if user is None:
            raise ApiError(401, INVALID_TOKEN)
        request.user = user  # as a session's request has it
        return _researcher(user)


class Session(AuthBase):
    openapi_type = "apiKey"
    openapi_in = "cookie"
    openapi_name = settings.SESSION_COOKIE_NAME
    openapi_description = "The login session, as the pages call the API; a POST sends the X-CSRFToken header"
    csrf = True  # ninja's docs page then sends the CSRF token with the requests it tries out

    def __call__(self, request):
        if not request.user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request):
            raise ApiError(403, "CSRF check failed; send the X-CSRFToken header")
        return _researcher(request.user)


# What a path id names, by its route's URL name (the first prefix that matches).
ID_OF = {"api-taskset-import": "taskset import", "api-sweep": "sweep", "api-run": "run"}


def invalid_request(request, exc: ValidationError) -> JsonResponse:
    """Ninja's 422 `{"detail": [...]}` for a parameter it cannot read, in the API's shape. Ninja's
    paths take any text where a route has an id (/api/runs/abc/ reaches the route): an id that is
    not a whole number (schemas.Id) names nothing, so it is a 404 naming it. Query parameters are
    text the routes check themselves, so anything else is rare: a 400 naming each parameter."""
    for problem in exc.errors:
        where, *name = problem["loc"]
        if where == "path" and name:
            sent = str(request.resolver_match.kwargs.get(name[0], ""))[:60]
            url_name = request.resolver_match.url_name or ""
            kind = next((kind for prefix, kind in ID_OF.items() if url_name.startswith(prefix)), "object")
            return error(404, f"no {kind} {sent!r}: not an id (ids are whole numbers)")
    problems = [{"key": ".".join(map(str, problem["loc"])), "message": problem["msg"]} for problem in exc.errors]
    listed = "; ".join(f"{problem['key']}: {problem['message']}" for problem in problems)
    return error(400, f"invalid request: {listed}", errors=problems)


def add_error_handlers(api) -> None:
    """Every refusal and failure of a route as `{"error": ...}`; ninja's own use `{"detail": ...}`."""
    handlers = {
        ApiError: lambda request, exc: error(exc.http_status, exc.message, **exc.extra),
        # every auth found no user: neither a token nor a session
        AuthenticationError: lambda request, exc: error(401, "log in, or send Authorization: Bearer <token>"),
        Http404: lambda request, exc: error(404, str(exc) or "not found"),
        PermissionDenied: lambda request, exc: error(403, str(exc) or "forbidden"),
        ValidationError: invalid_request,
    }
    for exception, handler in handlers.items():
        api.add_exception_handler(exception, handler)

