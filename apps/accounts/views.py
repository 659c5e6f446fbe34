from django.contrib.auth.views import PasswordChangeView
from django.shortcuts import redirect

from .forms import ThrottledPasswordChangeForm


class ThrottledPasswordChangeView(PasswordChangeView):
    """The one password change page (the admin's link comes here too): its old password is
    throttled as a login's (apps.accounts.throttle)."""

    form_class = ThrottledPasswordChangeForm
    template_name = "accounts/password_change.html"

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "request": self.request}


def admin_password_change(request, extra_context=None):
    """AdminSite.password_change: the site's page, so that there is one, and it is throttled."""
    return redirect("password_change")
