from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from . import throttle


class ThrottledLoginMixin:
    """Login throttling (apps.accounts.throttle) for an AuthenticationForm: a locked address or
    account is refused before the password is checked; a wrong password counts against both."""

    def clean(self):
        username, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if username is None or not password:
            return super().clean()  # a field is missing: no password was checked, nothing counts
        if until := throttle.locked_until(self.request, username):
            raise ValidationError(throttle.lockout_message(until), code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            # No user: a wrong password or username. (The admin also refuses the right password
            # of a user who is not staff; that is no guess.)
            if self.user_cache is None:
                throttle.failed(self.request, username)
            raise
        throttle.succeeded(self.request, username)
        return cleaned


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "Your username and password didn't match. Please try again.",
    }


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
