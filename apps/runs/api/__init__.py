"""The JSON API under /api/ (docs/api.md), on django-ninja: its OpenAPI document at
/api/openapi.json, Swagger UI at /api/docs/.

Pages call it with their session; scripts with `Authorization: Bearer <token>` (tokens.py). API
clients get every refusal as JSON (auth.py), never the login page.
"""

from functools import wraps

from django.contrib.auth.decorators import login_not_required
from django.urls import URLPattern

from .routes import api, docs_page
from .tokens import method_refusal, token_for, token_or_session, user_for_token
from .worker_schemas import workers_json

__all__ = ["docs_page", "token_for", "token_or_session", "urlpatterns", "user_for_token", "workers_json"]


def _api_view(view):
    """Ninja's view for one path, answering for itself: no login page for anonymous callers (the
    API's 401 instead), and a wrong method as JSON naming the right ones (ninja's is plain text)."""

    @login_not_required
    @wraps(view)  # keeps ninja's csrf_exempt: its session auth does the CSRF check (auth.py)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        return method_refusal(response) if response.status_code == 405 else response

    return wrapped


# Without ninja's URL namespace, so the routes keep their names (`reverse("api-runs")`); less
# ninja's placeholder for its root, which `api-index` answers.
urlpatterns = [
    URLPattern(pattern.pattern, _api_view(pattern.callback), pattern.default_args, pattern.name)
    for pattern in api.urls[0]
    if pattern.name != "api-root"
]
