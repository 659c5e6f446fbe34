from .roles import ROLES, roles_of


def roles(request):
    """The user's roles in ROLES' order (a page lists them; `'researcher' in user_roles` tests them)."""
    held = roles_of(getattr(request, "user", None)) if hasattr(request, "user") else set()
    return {"user_roles": [role for role in ROLES if role in held]}
