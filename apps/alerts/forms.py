from django import forms

from .models import AlertSettings
from .webhook import address_problem


class AlertSettingsForm(forms.ModelForm):
    """The settings page: when, and how; the account's email address is edited here too."""

    address = forms.EmailField(required=False, label="Email address", max_length=254)
    stall_minutes = forms.IntegerField(required=False, min_value=1, max_value=7 * 24 * 60, label="Stalled after",
                                       help_text="minutes without a trainer step while running; empty: never")

    class Meta:
        model = AlertSettings
        fields = ("on_finish", "on_failure", "stall_minutes", "email", "webhook_url")
        labels = {"on_finish": "A run ends", "on_failure": "A run fails", "email": "By email",
                  "webhook_url": "Webhook URL"}

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["address"].initial = user.email

    def clean(self):
        cleaned = super().clean()
        # an address that is not one has its own error already ("Enter a valid email address")
        if cleaned.get("email") and not cleaned.get("address") and "address" not in self.errors:
            self.add_error("address", "email alerts need an address")
        url = cleaned.get("webhook_url")
        if url and (problem := address_problem(url)):
            self.add_error("webhook_url", problem)
        return cleaned

    def save(self, commit=True):
        settings = super().save(commit=False)
        self.user.email = self.cleaned_data.get("address") or ""
        self.user.save(update_fields=["email"])
        settings.save()
        return settings
