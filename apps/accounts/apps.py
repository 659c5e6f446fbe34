from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save

from .roles import CURATOR, ROLES

# The curator group may change everything in these apps through the admin.
CURATED_APPS = ("tasksets", "runs", "buffer", "feedback", "alerts")


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
        from django.contrib import admin
        from django.contrib.auth import get_user_model

        from . import revocation
        from .forms import AdminLoginForm
        from .views import admin_password_change

        admin.site.login_form = AdminLoginForm  # throttled as the login page is
        admin.site.password_change = admin_password_change  # the site's page, throttled
        # The admin's app sidebar took 300 of 1366 px and cut the experience list's last columns;
        # the breadcrumbs and the dashboard's nav reach the same pages.
        admin.site.enable_nav_sidebar = False
        admin.site.site_header = admin.site.site_title = "rftweb admin"
        admin.site.site_url = "/"
        post_migrate.connect(create_role_groups, dispatch_uid="rftweb-role-groups")
        # Open websockets of a user who loses access are closed (apps.accounts.revocation).
        user_model = get_user_model()
        post_save.connect(revocation.user_saved, sender=user_model, dispatch_uid="rftweb-revoke-saved")
        post_delete.connect(revocation.user_deleted, sender=user_model, dispatch_uid="rftweb-revoke-deleted")
        user_logged_out.connect(revocation.user_logged_out, dispatch_uid="rftweb-revoke-logged-out")
        m2m_changed.connect(
            revocation.groups_changed, sender=user_model.groups.through, dispatch_uid="rftweb-revoke-groups"
        )
