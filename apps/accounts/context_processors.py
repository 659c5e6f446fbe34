from .roles import roles_of


def roles(request):
    return {"user_roles": roles_of(getattr(request, "user", None)) if hasattr(request, "user") else set()}
