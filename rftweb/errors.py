"""Error responses: JSON under /api/ (an API client parses JSON, never an HTML page), pages elsewhere.

`RejectNulMiddleware` answers 400 for a NUL character anywhere in the address, a query parameter
or a form field: Postgres text cannot hold one, so it would otherwise reach the database as a 500.
A page whose form names a NUL beside its field itself (`form_checks_nul`) gets its form as sent.
`CommonMiddleware` is Django's, but an API address missing its trailing slash is a 308.
The handlers (rftweb.urls: handler400/403/404/500) give Django's own pages outside /api/ and
`{"error": ...}` under it, an unhandled exception included (with DEBUG on Django shows its
debug page instead, as it does for every other page).
"""

import json

from django.http import HttpResponseBadRequest, JsonResponse
from django.http.response import HttpResponseRedirectBase
from django.middleware import common
from django.utils.http import escape_leading_slashes
from django.views import defaults

# The JSON API, and the annotation page's own JSON endpoints (apps/feedback/api.py), whose script
# reads every answer as JSON.
API_PREFIXES = ("/api/", "/annotate/api/")


def is_api(request) -> bool:
    """Whether the client reads JSON: an address under API_PREFIXES, or a page a script fetched
    with its API token (apps.runs.api.token_or_session sets `by_token`)."""
    return request.path_info.startswith(API_PREFIXES) or getattr(request, "by_token", False)


def bad_request_response(request, message: str):
    if is_api(request):
        return _api_error(400, message)
    # Plain text: the message names the parameter as sent, and text/plain (with nosniff) renders no markup.
    return HttpResponseBadRequest(f"Bad request: {message}", content_type="text/plain; charset=utf-8")


def form_checks_nul(view):
    """Marks a page view whose form refuses a NUL in every field it reads, beside that field
    (Django's CharField does: "Null characters are not allowed."; a service that reads a field
    itself names it), so RejectNulMiddleware lets a NUL in a form field's value through to it: the
    page then comes back holding everything typed. The middleware's 400 page had replaced the
    whole form (a NUL pasted into the launch form's name lost the config typed around it)."""
    view.form_checks_nul = True
    return view


class RejectNulMiddleware:
    """Before anything reads the request (sessions, CSRF, the view): a NUL in the path or in any
    query or form parameter, name or value, is a 400 naming where it was; but a NUL in a form
    field's value is left to a view marked `form_checks_nul`."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path:
            return self.refuse(request, "the address")
        if problem := nul_in(request.GET, "query parameter"):
            return self.refuse(request, problem)
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        """The form, once its view is known; before CsrfViewMiddleware's, which reads it. The API
        reads JSON bodies (and refuses NULs in them itself): parsing one as a form here would
        leave the view no body to read."""
        if is_api(request):
            return None
        if problem := nul_in(request.POST, "form field", values=not getattr(view_func, "form_checks_nul", False)):
            return self.refuse(request, problem)
        return None

    @staticmethod
    def refuse(request, where: str):
        return bad_request_response(request, f"{where} holds a NUL character (\\x00), which is never valid")


def nul_in(params, where: str, *, values: bool = True) -> str | None:
    """"the <where> 'name'" for the first parameter whose name (or, with `values`, a value) holds a NUL."""
    for name, sent in params.lists():
        if "\x00" in name or (values and any("\x00" in value for value in sent)):
            return f"the {where} {name.replace(chr(0), '?')!r}"
    return None


class PermanentRedirectKeepingMethod(HttpResponseRedirectBase):
    status_code = 308  # unlike 301, the client sends the same method and body again


class CommonMiddleware(common.CommonMiddleware):
    """Django's, but under /api/ an address that resolves only with a slash appended is a 308 to it,
    with JSON naming it. Django's 301 is followed as a GET (a script's POST /api/runs read the run
    list instead of launching), and under DEBUG a POST is its RuntimeError, a 500. requests follows
    a 308 with the same POST; urllib raises it as an HTTPError, whose JSON names the address."""

    def process_response(self, request, response):
        if is_api(request) and response.status_code == 404 and self.should_redirect_with_slash(request):
            location = escape_leading_slashes(request.get_full_path(force_append_slash=True))
            message = f"use {location}: the API's addresses end with a slash"
            response = PermanentRedirectKeepingMethod(location, content=json.dumps({"error": message}),
                                                      content_type="application/json")
        return super().process_response(request, response)


def _api_error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def bad_request(request, exception):
    return _api_error(400, "bad request") if is_api(request) else defaults.bad_request(request, exception)


def permission_denied(request, exception):
    if is_api(request):
        return _api_error(403, str(exception) or "forbidden")
    return defaults.permission_denied(request, exception)


def page_not_found(request, exception):
    if is_api(request):
        return _api_error(404, f"not found: {request.path}")
    return defaults.page_not_found(request, exception)


def server_error(request):
    """The exception is logged by Django before this is called; the client learns nothing of it."""
    return _api_error(500, "internal server error") if is_api(request) else defaults.server_error(request)


class RefusalWithoutTraceback:
    """A logging filter for django.request: a refusal (a 4xx response: PermissionDenied, Http404,
    a bad request) keeps its one line, "Forbidden (Permission denied): /runs/", without the
    traceback Django attaches. Refusals are the product working; a walkthrough's server log held
    30 lines of traceback per refused page, and the real errors (5xx, with theirs) were lost in them."""

    def filter(self, record) -> bool:
        status = getattr(record, "status_code", None)  # django.utils.log.log_response's extra
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = record.exc_text = None
        return True
