"""A user's alert settings, a test alert, and the alerts of the last days with what became of each."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.roles import RESEARCHER, role_required
from rftweb.errors import form_checks_nul

from . import services
from .forms import AlertSettingsForm
from .models import Alert

SHOWN = 50


@form_checks_nul
@role_required(RESEARCHER)
def alert_settings(request):
    prefs = services.settings_of(request.user)
    form = AlertSettingsForm(request.POST or None, instance=prefs, user=request.user)
    if request.method == "POST" and form.is_valid():
        prefs = form.save()
        if prefs.webhook_url and not prefs.webhook_secret:
            prefs.webhook_secret = services.new_secret()
            prefs.save(update_fields=["webhook_secret"])
        messages.success(request, "Alert settings saved.")
        return redirect("alert-settings")
    sent = Alert.objects.filter(user=request.user).select_related("run", "sweep")[:SHOWN]
    return render(request, "alerts/settings.html", {"form": form, "prefs": prefs, "alerts": sent,
                                                    "failed": any(a.error for a in sent)})


@require_POST
@role_required(RESEARCHER)
def test_alert(request):
    made = services.raise_alert(request.user, Alert.Event.TEST)
    if made:
        messages.success(request, f"A test alert is on its way by {' and '.join(a.channel for a in made)}: "
                                  "its outcome shows below.")
    else:
        messages.warning(request, "Nothing to send it by: turn on email (with an address) or set a webhook URL.")
    return redirect("alert-settings")


@require_POST
@role_required(RESEARCHER)
def new_webhook_secret(request):
    prefs = services.settings_of(request.user)
    prefs.webhook_secret = services.new_secret()
    prefs.save(update_fields=["webhook_secret"])
    messages.success(request, "A new webhook secret: the receiver must check signatures with it from now on.")
    return redirect("alert-settings")
