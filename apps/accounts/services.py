from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from .roles import CURATOR, ROLES


class PeopleError(ValueError):
    """A change to a person that would lock someone out or cannot be made here; says why."""


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


@transaction.atomic
def set_roles(user, roles, *, by) -> None:
    """The person's roles (their other groups stay); a curator is staff, as create_user makes one.
    Nobody takes their own curator role (another curator can), and a superuser's are the admin's."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise PeopleError(f"unknown role(s) {sorted(unknown)}; known: {', '.join(ROLES)}")
    if user.is_superuser:
        raise PeopleError(f"{user.username} is a superuser, with every role: change that in the admin")
    if user.pk == by.pk and CURATOR not in roles:
        raise PeopleError("you cannot take your own curator role: another curator can")
    others = list(user.groups.exclude(name__in=ROLES))
    user.groups.set([*others, *Group.objects.filter(name__in=roles)])  # revocation: its sockets check again
    if user.is_staff != (CURATOR in roles):
        user.is_staff = CURATOR in roles
        user.save(update_fields=["is_staff"])


def set_active(user, active: bool, *, by) -> None:
    """Let a person log in, or not (their judgements and runs stay: nobody is deleted here)."""
    if user.pk == by.pk and not active:
        raise PeopleError("you cannot deactivate yourself")
    user.is_active = active
    user.save(update_fields=["is_active"])
