"""Django's own admins of users and groups, with the selection check every admin of the site has
(apps/core/admin_selection.py). People are managed on People (`/accounts/people/`); these stay for
what only the admin offers (a user's permissions, say)."""
from django.contrib import admin
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from apps.core.admin_selection import CheckedSelectionMixin

admin.site.unregister(get_user_model())
admin.site.unregister(Group)


@admin.register(get_user_model())
class UserAdmin(CheckedSelectionMixin, auth_admin.UserAdmin):
    pass


@admin.register(Group)
class GroupAdmin(CheckedSelectionMixin, auth_admin.GroupAdmin):
    pass
