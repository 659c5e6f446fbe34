from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.core.exceptions import ValidationError

from . import throttle


class ThrottledLoginMixin:
    """Login throttling (apps.accounts.throttle) for an AuthenticationForm: a locked address or
    account is refused before the password is checked; a wrong password counts against both."""

    def clean(self):
        username, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        if username is None or not password:
            return super().clean()  # a field is missing: no password was checked, nothing counts
        if until := throttle.attempt(self.request, username):
            raise ValidationError(throttle.lockout_message(until), code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            # No user: a wrong password or username. (The admin also refuses the right password
            # of a user who is not staff; that is no guess.)
            if self.user_cache is None:
                throttle.failed(self.request, username)
            else:
                throttle.succeeded(self.request, username)
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


class ThrottledPasswordChangeForm(PasswordChangeForm):
    """The old password of a password change, throttled as a login's password is: refused
    while the address or account is locked, a wrong one counting against both. The view passes
    `request` (ThrottledPasswordChangeView). Before, 30 wrong old passwords were all checked (#41,
    finding 11)."""

    def __init__(self, user, *args, request=None, **kwargs):
        self.request = request
        super().__init__(user, *args, **kwargs)

    def clean_old_password(self):
        username = self.user.get_username()
        if until := throttle.attempt(self.request, username):
            raise ValidationError(throttle.lockout_message(until, "changing the password"), code="throttled")
        try:
            old_password = super().clean_old_password()
        except ValidationError:
            throttle.failed(self.request, username)
            raise
        throttle.succeeded(self.request, username)
        return old_password
