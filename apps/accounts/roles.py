"""Roles are Django groups. Staff users count as curators; curators can do what researchers can.

annotator  rates, edits and compares experiences
reviewer   accepts or rejects annotators' judgements on runs that require review (and annotates)
researcher uploads tasksets, launches and controls runs (and annotates)
curator    cleans the buffer in the admin (and everything a researcher and a reviewer do)
"""
from functools import wraps

from django.core.exceptions import PermissionDenied

ANNOTATOR = "annotator"
REVIEWER = "reviewer"
RESEARCHER = "researcher"
CURATOR = "curator"
ROLES = (ANNOTATOR, REVIEWER, RESEARCHER, CURATOR)

# Each role also grants the roles listed here.
_IMPLIED = {
    CURATOR: {CURATOR, RESEARCHER, REVIEWER, ANNOTATOR},
    RESEARCHER: {RESEARCHER, ANNOTATOR},
    REVIEWER: {REVIEWER, ANNOTATOR},
    ANNOTATOR: {ANNOTATOR},
}


def roles_of(user) -> set[str]:
    if not user.is_authenticated:
        return set()
    if user.is_superuser or user.is_staff:
        return set(ROLES)
    cached = getattr(user, "_rftweb_roles", None)
    if cached is None:
        cached = set()
        for name in user.groups.filter(name__in=ROLES).values_list("name", flat=True):
            cached |= _IMPLIED[name]
        user._rftweb_roles = cached
    return cached


def has_role(user, role: str) -> bool:
    return role in roles_of(user)


def role_required(*roles: str):
    """View decorator: 403 for a logged-in user without one of the roles (anonymous users never
    get here: LoginRequiredMiddleware sends them to the login page first)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not any(has_role(request.user, role) for role in roles):
                raise PermissionDenied(f"this page needs the {' or '.join(roles)} role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
