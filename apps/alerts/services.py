"""Alerts (issue #44, item 2; W&B's run alerts): a user is told when one of their runs completes,
is stopped or fails, takes no trainer step for N minutes, or when a sweep's last run ends, by
email (Django's mail backend: the console in the demo) and/or a webhook (JSON, signed).

An alert is written when its event commits (services.set_status calls `run_changed` then; the
stall check runs on beat, embedded on a thread of the server) and sent by a task on the `default`
queue, never in the run's own process: a slow mail server or a dead receiver never holds a run.
A failed attempt is tried again after 30 s, 1, 2 and 4 min; the fifth failure gives up, and the
user's settings page lists it with its error."""

import json
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Max, Q
from django.urls import reverse
from django.utils import timezone

from apps.runs.models import MetricPoint, Run, Sweep
from rftweb.celery import enqueue

from . import webhook
from .models import Alert, AlertSettings

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
BACKOFF_S = 30  # doubled after each failure: 30 s, 1, 2, 4 min
LEASE_S = 60  # an attempt in flight, longer than the webhook's 10 s and the mail server's timeout
KEPT_DAYS = 30
UNFINISHED = [status for status in Run.Status.values if status not in Run.FINISHED]
RUN_EVENTS = {Run.Status.COMPLETED: Alert.Event.COMPLETED, Run.Status.STOPPED: Alert.Event.STOPPED,
              Run.Status.FAILED: Alert.Event.FAILED}


def settings_of(user) -> AlertSettings:
    return AlertSettings.objects.get_or_create(user=user)[0]


def new_secret() -> str:
    return secrets.token_hex(24)


# ---- events --------------------------------------------------------------------------------------


def run_changed(run_id: int) -> None:
    """After a run's status change commits: its sweep's end (or, resumed, its end undone), and the
    alerts its owner asked for. A sweep's runs that end well say nothing each: the sweep says it once."""
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return
    ended = None
    if run.sweep_id and run.is_finished:
        now = timezone.now()
        if Sweep.objects.filter(pk=run.sweep_id, ended_at=None).exclude(runs__status__in=UNFINISHED) \
                .update(ended_at=now):  # one of the sweep's last runs to end wins this update
            ended = Sweep.objects.select_related("owner").get(pk=run.sweep_id)
    elif run.sweep_id:
        Sweep.objects.filter(pk=run.sweep_id).exclude(ended_at=None).update(ended_at=None)
    if not run.is_finished:
        return
    prefs = settings_of(run.owner)
    event = RUN_EVENTS[run.status]
    if prefs.on_failure if event == Alert.Event.FAILED else (prefs.on_finish and not run.sweep_id):
        raise_alert(run.owner, event, run=run)
    if ended and settings_of(ended.owner).on_finish:
        raise_alert(ended.owner, Alert.Event.SWEEP_ENDED, sweep=ended)


def check_stalls(now=None) -> int:
    """Alert each running run whose owner set stall_minutes and whose trainer took no step for that
    long (since its last trainer point, its start or its last status change, whichever is latest),
    once per step it stalls at. Returns how many it raised."""
    now = now or timezone.now()
    raised = 0
    for prefs in AlertSettings.objects.filter(stall_minutes__gt=0).select_related("user"):
        runs = Run.objects.filter(owner=prefs.user, status=Run.Status.RUNNING).annotate(
            last_step_at=Max("metrics__time", filter=Q(metrics__role=MetricPoint.Role.TRAINER)))
        for run in runs:
            since = max(t for t in (run.last_step_at, run.started_at, run.updated_at) if t is not None)
            if now - since < timedelta(minutes=prefs.stall_minutes):
                continue
            key = f"stall:{run.pk}:{run.trainer_step}"
            if not Alert.objects.filter(user=prefs.user, key=key).exists():
                raise_alert(prefs.user, Alert.Event.STALLED, run=run, key=key,
                            stalled_minutes=int((now - since).total_seconds() // 60))
                raised += 1
    return raised


def raise_alert(user, event: str, *, run: Run | None = None, sweep: Sweep | None = None, key: str = "",
                **details) -> list[Alert]:
    """An Alert per channel the user set, each sent by a task once this commits."""
    prefs = settings_of(user)
    channels = ([Alert.Channel.EMAIL] if prefs.email and user.email else []) + \
               ([Alert.Channel.WEBHOOK] if prefs.webhook_url else [])
    subject, payload = _message(event, run, sweep, details)
    made = [Alert.objects.create(user=user, event=event, channel=channel, run=run, sweep=sweep, key=key,
                                 subject=subject, payload=payload, next_attempt_at=timezone.now())
            for channel in channels]  # due now: if its task is lost, retry_due sends it
    for alert in made:
        transaction.on_commit(lambda pk=alert.pk: enqueue("workers.tasks.deliver_alert", pk))
    return made


def _link(path: str) -> str:
    return settings.RFTWEB_BASE_URL.rstrip("/") + path


def _message(event: str, run: Run | None, sweep: Sweep | None, details: dict) -> tuple[str, dict]:
    payload = {"event": event, "at": timezone.now().isoformat(), **details}
    if run is not None:
        payload["run"] = {"id": run.pk, "name": run.name, "status": run.status, "trainer_step": run.trainer_step,
                          "error": run.error, "url": _link(reverse("run-detail", args=[run.pk]))}
    if sweep is not None:
        runs = list(sweep.runs.order_by("pk").values("id", "name", "status"))
        payload["sweep"] = {"id": sweep.pk, "name": sweep.name, "runs": runs,
                            "url": _link(reverse("sweep-detail", args=[sweep.pk]))}
    subject = {
        Alert.Event.COMPLETED: lambda: f"run {run.name!r} completed at step {run.trainer_step}",
        Alert.Event.STOPPED: lambda: f"run {run.name!r} was stopped at step {run.trainer_step}",
        Alert.Event.FAILED: lambda: f"run {run.name!r} failed at step {run.trainer_step}",
        Alert.Event.STALLED: lambda: f"run {run.name!r}: no trainer step for {details['stalled_minutes']} min "
                                     f"(at step {run.trainer_step})",
        Alert.Event.SWEEP_ENDED: lambda: f"sweep {sweep.name!r} ended: " + ", ".join(
            f"{sum(r['status'] == status for r in payload['sweep']['runs'])} {status}"
            for status in Run.FINISHED if any(r["status"] == status for r in payload["sweep"]["runs"])),
        Alert.Event.TEST: lambda: "a test alert: this is what alerts look like",
    }[event]()
    payload["text"] = subject
    return subject[:300], payload


# ---- sending -------------------------------------------------------------------------------------


def deliver(alert_id: int) -> str:
    """One attempt at sending the alert, if it is due; its outcome is written on it."""
    now = timezone.now()
    claimed = Alert.objects.filter(pk=alert_id, status=Alert.Status.PENDING).filter(
        Q(next_attempt_at=None) | Q(next_attempt_at__lte=now)
    ).update(attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=LEASE_S))
    if not claimed:
        return "not due"
    alert = Alert.objects.select_related("user").get(pk=alert_id)
    try:
        _send(alert)
    except Exception as err:  # noqa: BLE001 - any failure of the receiver is the alert's, written on it
        given_up = alert.attempts >= MAX_ATTEMPTS
        Alert.objects.filter(pk=alert.pk).update(
            error=str(err)[:2000], status=Alert.Status.FAILED if given_up else Alert.Status.PENDING,
            next_attempt_at=None if given_up else now + timedelta(seconds=BACKOFF_S * 2 ** (alert.attempts - 1)))
        logger.warning("alert %s (%s) attempt %s failed: %s", alert.pk, alert.channel, alert.attempts, err)
        return "failed"
    Alert.objects.filter(pk=alert.pk).update(status=Alert.Status.SENT, sent_at=timezone.now(), error="",
                                             next_attempt_at=None)
    return "sent"


def _send(alert: Alert) -> None:
    if alert.channel == Alert.Channel.EMAIL:
        if not alert.user.email:
            raise ValueError("the account has no email address")
        send_mail(f"[rftweb] {alert.subject}", _email_text(alert.payload), None, [alert.user.email])
        return
    prefs = settings_of(alert.user)
    if not prefs.webhook_url:
        raise ValueError("no webhook URL is set any more")
    body = json.dumps(alert.payload).encode()
    webhook.post(prefs.webhook_url, body, secret=prefs.webhook_secret, event=alert.event)


def _email_text(payload: dict) -> str:
    lines = [payload["text"], ""]
    if "run" in payload:
        run = payload["run"]
        lines += [f"Run: {run['name']} (#{run['id']}), {run['status']} at trainer step {run['trainer_step']}"]
        if run["error"]:
            lines += ["", "Its error:", run["error"][:2000], ""]
        lines += [run["url"]]
    if "sweep" in payload:
        lines += [f"Sweep: {payload['sweep']['name']}"]
        lines += [f"  {r['name']}: {r['status']}" for r in payload["sweep"]["runs"]]
        lines += ["", payload["sweep"]["url"]]
    lines += ["", f"Your alert settings: {_link(reverse('alert-settings'))}"]
    return "\n".join(lines)


def retry_due() -> int:
    """Send the alerts due again (beat, every RFTWEB_ALERT_INTERVAL s), and forget those older than
    KEPT_DAYS. Returns how many it tried."""
    Alert.objects.filter(created_at__lt=timezone.now() - timedelta(days=KEPT_DAYS)).delete()
    due = Alert.objects.filter(status=Alert.Status.PENDING, next_attempt_at__lte=timezone.now())
    ids = list(due.values_list("pk", flat=True)[:200])
    for pk in ids:
        deliver(pk)
    return len(ids)


def beat() -> None:
    """What beat's alerts entry does: stalls, then the retries."""
    check_stalls()
    retry_due()
