"""API tokens: `Authorization: Bearer <token>`.

A token is the user's id and an HMAC of it with the user's password hash under SECRET_KEY, so it
needs no table, cannot be forged, and dies when the password changes (which is how a user revokes
it)."""

import re
from functools import wraps

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.utils.crypto import constant_time_compare, salted_hmac

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


def token_or_session(view):
    """For a page that scripts fetch too (a checkpoint download): with an Authorization header its
    token's user, as on the API (a 401 if it names none); without one, the session, as on every
    page (anonymous users go to the login page)."""

    @login_not_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.headers.get("Authorization"):
            user = bearer_user(request)
            if user is None:
                return JsonResponse({"error": INVALID_TOKEN}, status=401, headers=CHALLENGE)
            request.user = user
        elif not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapped
