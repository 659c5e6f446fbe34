from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from .roles import ROLES


@transaction.atomic
def create_user(username: str, password: str, *, roles=(), email: str = "", is_superuser: bool = False):
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {sorted(unknown)}; known: {', '.join(ROLES)}")
    User = get_user_model()
    extra = {"is_staff": True} if "curator" in roles else {}  # curators work in the admin
    if is_superuser:
        user = User.objects.create_superuser(username=username, email=email, password=password)
    else:
        user = User.objects.create_user(username=username, email=email, password=password, **extra)
    user.groups.set(Group.objects.filter(name__in=roles))
    return user
