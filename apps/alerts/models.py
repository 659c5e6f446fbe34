from django.conf import settings
from django.db import models


class AlertSettings(models.Model):
    """What a user is told about their runs and sweeps, and how (apps/alerts/services.py)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, related_name="alert_settings", on_delete=models.CASCADE)
    on_finish = models.BooleanField(default=True, help_text="a run completes or is stopped; a sweep's last run ends")
    on_failure = models.BooleanField(default=True, help_text="with its error")
    stall_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="a running run takes no trainer step for this many minutes; empty: never")
    email = models.BooleanField(default=False, help_text="send each alert to the account's email address")
    webhook_url = models.URLField(max_length=500, blank=True, help_text="POST each alert to this URL as JSON")
    # Signs each webhook body (X-Rftweb-Signature: sha256=HMAC(secret, body)), so the receiver can
    # tell it came from here. Shown on the settings page, made anew on request.
    webhook_secret = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class Alert(models.Model):
    """One alert to one user by one channel, and what became of it: sent, or retried with backoff
    until it is sent or given up on (`error` says why; the settings page lists it)."""

    class Event(models.TextChoices):
        COMPLETED = "run.completed"
        STOPPED = "run.stopped"
        FAILED = "run.failed"
        STALLED = "run.stalled"
        SWEEP_ENDED = "sweep.ended"
        TEST = "test"

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    class Status(models.TextChoices):
        PENDING = "pending"  # to be sent (again) at next_attempt_at
        SENT = "sent"
        FAILED = "failed"  # given up after the last attempt

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="alerts", on_delete=models.CASCADE)
    event = models.CharField(max_length=20, choices=Event.choices)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    run = models.ForeignKey("runs.Run", null=True, blank=True, related_name="alerts", on_delete=models.SET_NULL)
    sweep = models.ForeignKey("runs.Sweep", null=True, blank=True, related_name="alerts", on_delete=models.SET_NULL)
    key = models.CharField(max_length=100, blank=True, help_text="one alert per key: a stall's run and step")
    subject = models.CharField(max_length=300)
    payload = models.JSONField(help_text="the webhook's JSON body; the email's text is made from it")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="the last attempt's failure")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="alert_due")]
