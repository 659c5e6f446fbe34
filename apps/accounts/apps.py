from django.apps import AppConfig
from django.db.models.signals import post_migrate

from .roles import CURATOR, ROLES

# The curator group may change everything in these apps through the admin.
CURATED_APPS = ("tasksets", "runs", "buffer", "feedback")


def create_role_groups(sender, **kwargs):
    """Runs after every app's migrations (and after test flushes), so the last run sees every permission."""
    # Imported here: apps.py loads before the app registry is ready, and models cannot load then.
    from django.contrib.auth.models import Group, Permission

    for name in ROLES:
        Group.objects.get_or_create(name=name)
    Group.objects.get(name=CURATOR).permissions.set(
        Permission.objects.filter(content_type__app_label__in=CURATED_APPS)
    )


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"

    def ready(self):
        post_migrate.connect(create_role_groups, dispatch_uid="rftweb-role-groups")
