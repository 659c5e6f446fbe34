"""API tokens: `Authorization: Bearer <token>`.

A token is the user's id and an HMAC of it with the user's token secret (models.ApiTokenSecret, a
random value made on first use) under SECRET_KEY, so it cannot be forged, and dies when the
password changes (which is how a user revokes it: the change deletes the secret) but not when
Django only rewrites the password's hash."""

import re
from functools import wraps

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, JsonResponse
from django.utils.crypto import constant_time_compare, salted_hmac
from django.views.decorators.csrf import csrf_exempt
from ninja.utils import check_csrf

from rftweb.errors import page_not_found

from ..models import ApiTokenSecret

TOKEN_PREFIX = "rft"
TOKEN_SALT = "apps.runs.api.token"
INVALID_TOKEN = "invalid API token"
# What a 401 answers with, so that a client knows to send a token.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="rftweb"'}

# The one spelling of a token, as token_for writes it: ASCII digits without leading zeros (so
# `rft_04_...` is not a second spelling of `rft_4_...`, and `rft_²_...` or a 5,000-digit id never
# reaches int() or the database), then the hex HMAC.
TOKEN_FORMAT = re.compile(rf"{TOKEN_PREFIX}_([1-9][0-9]{{0,17}})_([0-9a-f]{{64}})")


def token_for(user) -> str:
    secret, _ = ApiTokenSecret.objects.get_or_create(user=user)
    return f"{TOKEN_PREFIX}_{user.pk}_{_token_mac(user.pk, secret.secret)}"


def _token_mac(user_id, secret: str) -> str:
    return salted_hmac(TOKEN_SALT, f"{user_id}:{secret}", algorithm="sha256").hexdigest()


def user_for_token(token: str):
    """The active user the token belongs to, or None (also when the user has no secret yet: no
    token was made since their last password change)."""
    match = TOKEN_FORMAT.fullmatch(token)
    if match is None:
        return None
    user_id, mac = match.groups()
    user = get_user_model().objects.filter(pk=int(user_id), is_active=True).select_related("api_token_secret").first()
    secret = getattr(user, "api_token_secret", None)  # a missing one raises an AttributeError
    if secret is None or not constant_time_compare(mac, _token_mac(user.pk, secret.secret)):
        return None
    return user


def bearer_user(request):
    """The user of the request's `Authorization: Bearer <token>` header, or None when it names none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return user_for_token(token.strip()) if scheme.lower() == "bearer" else None


def token_or_session(view):
    """For a page that scripts fetch too (a checkpoint download, metrics, logs, feedback exports, a
    job's progress): with an Authorization header its token's user, as on the API (a 401 if it
    names none), and every refusal after that JSON, as a script reads it; without one, the session,
    as on every page (anonymous users go to the login page), with its CSRF check. The role checks
    are the view's own, below this, the same for either."""

    @login_not_required
    @csrf_exempt  # a token needs no CSRF check (no cookie rides on it): the session's is made below
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        refused = _token_user(request) if request.headers.get("Authorization") else _session_user(request)
        if refused is not None:
            return refused
        if getattr(request, "by_token", False):
            return _refusals_as_json(request, view, args, kwargs)
        return view(request, *args, **kwargs)

    return wrapped


def _token_user(request):
    """The 401, or None with the token's user on the request, marked `by_token` (rftweb.errors then
    answers its refusals as JSON, as the views do their own)."""
    user = bearer_user(request)
    if user is None:
        return JsonResponse({"error": INVALID_TOKEN}, status=401, headers=CHALLENGE)
    request.user, request.by_token = user, True
    return None


def _session_user(request):
    """The login page for an anonymous user, the CSRF refusal of a session's POST without its token, else None."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    return check_csrf(request)


def _refusals_as_json(request, view, args, kwargs):
    """The view for a script. A 403 reaches rftweb.errors' handler, which answers JSON for `by_token`;
    a 404 is answered here, as under DEBUG Django shows its HTML page instead; require_GET's 405 is bare."""
    try:
        response = view(request, *args, **kwargs)
    except Http404 as missing:
        return page_not_found(request, missing)
    return method_refusal(response) if response.status_code == 405 else response


def method_refusal(response) -> JsonResponse:
    """A 405 as JSON naming the methods the view takes (Django's and ninja's are bare text)."""
    allowed = response["Allow"]
    message = f"use {' or '.join(sorted(allowed.split(', ')))}"
    return JsonResponse({"error": message}, status=405, headers={"Allow": allowed})
