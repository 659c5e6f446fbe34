"""Alerts (apps/alerts; issue #44, item 2): what is raised when a run ends, fails or stalls and when
a sweep's last run ends; email through Django's mail backend; webhooks to a real HTTP server, signed,
retried with backoff, refused for private addresses; the settings page. On Postgres and SQLite."""
import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from apps.alerts import services, webhook
from apps.alerts.models import Alert, AlertSettings
from apps.runs import services as runs
from apps.runs.models import MetricPoint, Run, Sweep

Status = Run.Status


@pytest.fixture
def sent(monkeypatch):
    """Stands in for the task queue: the ids of the alerts handed to workers.tasks.deliver_alert."""
    queued = []
    monkeypatch.setattr(services, "enqueue", lambda name, pk: queued.append((name, pk)))
    return queued


@pytest.fixture
def by_email(researcher):
    researcher.email = "res@example.org"
    researcher.save()
    AlertSettings.objects.create(user=researcher, email=True)
    return researcher


def end(run, *path):
    """Walk the run through these statuses, each committed (its alerts are raised on commit)."""
    for status in path:
        with transaction.atomic():
            runs.set_status(run, status, **({"error": "CUDA out of memory"} if status == Status.FAILED else {}))


class Receiver(BaseHTTPRequestHandler):
    answers: list[int] = []
    got: list[tuple[dict, bytes]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.got.append((dict(self.headers), body))
        code = Receiver.answers.pop(0) if Receiver.answers else 200
        self.send_response(code)
        if code == 302:
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.answers, Receiver.got = [], []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


# ---- events --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_that_completes_or_fails_is_emailed_to_its_owner(by_email, make_run, sent,
                                                                django_capture_on_commit_callbacks):
    done = make_run("done", owner=by_email, status=Status.RUNNING, trainer_step=12)
    end(done, Status.COMPLETED)
    (alert,) = Alert.objects.all()
    assert (alert.event, alert.channel, alert.run, sent) == ("run.completed", "email", done,
                                                             [("workers.tasks.deliver_alert", alert.pk)])
    assert services.deliver(alert.pk) == "sent" and services.deliver(alert.pk) == "not due"
    (email,) = mail.outbox
    assert email.to == ["res@example.org"] and email.subject == "[rftweb] run 'done' completed at step 12"
    assert f"http://localhost:8000/runs/{done.pk}/" in email.body
    broken = make_run("broken", owner=by_email, status=Status.RUNNING)
    end(broken, Status.FAILED)
    failed = Alert.objects.get(run=broken)
    services.deliver(failed.pk)
    assert failed.event == "run.failed" and "CUDA out of memory" in mail.outbox[1].body
    # Asked for failures only: a stop says nothing.
    AlertSettings.objects.filter(user=by_email).update(on_finish=False)
    end(make_run("stopped", owner=by_email, status=Status.RUNNING), Status.STOPPED)
    assert Alert.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_sweep_says_once_that_it_ended_and_a_resume_opens_it_again(by_email, make_run, sent):
    sweep = Sweep.objects.create(name="lr", owner=by_email, method="grid", space=[], count=3, base_config={})
    members = [make_run(f"lr {i}", owner=by_email, status=Status.RUNNING, sweep=sweep) for i in range(3)]
    end(members[0], Status.COMPLETED)
    end(members[1], Status.FAILED)  # a failure is said at once
    assert list(Alert.objects.values_list("event", flat=True)) == ["run.failed"]
    sweep.refresh_from_db()
    assert sweep.ended_at is None
    end(members[2], Status.STOPPED)
    sweep.refresh_from_db()
    assert sweep.ended_at is not None
    ended = Alert.objects.get(event="sweep.ended")
    assert ended.subject == "sweep 'lr' ended: 1 stopped, 1 completed, 1 failed"
    assert [r["status"] for r in ended.payload["sweep"]["runs"]] == ["completed", "failed", "stopped"]
    end(members[2], Status.QUEUED)  # resumed
    sweep.refresh_from_db()
    assert sweep.ended_at is None
    end(members[2], Status.STARTING, Status.RUNNING, Status.COMPLETED)
    assert Alert.objects.filter(event="sweep.ended").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_run_with_no_trainer_step_for_n_minutes_is_said_once_per_step(by_email, make_run, sent):
    AlertSettings.objects.filter(user=by_email).update(stall_minutes=10)
    run = make_run("slow", owner=by_email, status=Status.RUNNING, trainer_step=4)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(hours=1), updated_at=now - timedelta(hours=1))
    MetricPoint.objects.create(run=run, role="trainer", step=4, values={"loss": 1.0})
    MetricPoint.objects.filter(run=run).update(time=now - timedelta(minutes=9))
    assert services.check_stalls(now) == 0  # 9 minutes
    assert services.check_stalls(now + timedelta(minutes=2)) == 1
    assert services.check_stalls(now + timedelta(minutes=30)) == 0  # said for step 4 already
    (alert,) = Alert.objects.all()
    assert alert.subject == "run 'slow': no trainer step for 11 min (at step 4)"
    Run.objects.filter(pk=run.pk).update(trainer_step=5)
    MetricPoint.objects.create(run=run, role="trainer", step=5, values={"loss": 1.0})
    MetricPoint.objects.filter(run=run, step=5).update(time=now)
    assert services.check_stalls(now + timedelta(minutes=11)) == 1
    Run.objects.filter(pk=run.pk).update(status=Status.PAUSED)  # a paused run is not stalled
    assert services.check_stalls(now + timedelta(days=1)) == 0


@pytest.mark.django_db(transaction=True)
def test_nothing_is_raised_without_a_channel(researcher, make_run, sent):
    end(make_run("quiet", status=Status.RUNNING), Status.COMPLETED)
    assert not Alert.objects.exists() and not sent


# ---- webhooks ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_webhook_gets_the_alert_as_signed_json(researcher, receiver, sent, settings):
    settings.RFTWEB_WEBHOOK_PRIVATE = True  # the receiver is on this machine
    AlertSettings.objects.create(user=researcher, webhook_url=receiver, webhook_secret="s3cret")
    (alert,) = services.raise_alert(researcher, Alert.Event.TEST)
    assert services.deliver(alert.pk) == "sent"
    ((headers, body),) = Receiver.got
    assert json.loads(body)["event"] == "test" and headers["X-Rftweb-Event"] == "test"
    assert headers["X-Rftweb-Signature"] == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()


@pytest.mark.django_db
def test_a_failing_webhook_is_retried_with_backoff_then_given_up(researcher, receiver, sent, settings):
    settings.RFTWEB_WEBHOOK_PRIVATE = True
    AlertSettings.objects.create(user=researcher, webhook_url=receiver)
    Receiver.answers = [500, 503]
    (alert,) = services.raise_alert(researcher, Alert.Event.TEST)
    start = timezone.now()
    assert services.deliver(alert.pk) == "failed"
    alert.refresh_from_db()
    assert alert.status == "pending" and "answered 500" in alert.error
    assert timedelta(seconds=29) < alert.next_attempt_at - start < timedelta(seconds=31)
    assert services.retry_due() == 0  # not due yet
    Alert.objects.filter(pk=alert.pk).update(next_attempt_at=start)
    assert services.retry_due() == 1
    alert.refresh_from_db()
    assert alert.attempts == 2 and "answered 503" in alert.error
    assert timedelta(seconds=59) < alert.next_attempt_at - start < timedelta(seconds=61)  # doubled
    Alert.objects.filter(pk=alert.pk).update(next_attempt_at=start)
    services.retry_due()
    alert.refresh_from_db()
    assert (alert.status, alert.attempts, alert.error) == ("sent", 3, "")
    # A receiver that never answers well: given up after the fifth try.
    Receiver.answers = [500] * 5
    (again,) = services.raise_alert(researcher, Alert.Event.TEST)
    for _ in range(5):
        Alert.objects.filter(pk=again.pk).update(next_attempt_at=start)
        services.deliver(again.pk)
    again.refresh_from_db()
    assert (again.status, again.attempts, again.next_attempt_at) == ("failed", 5, None)


@pytest.mark.django_db
def test_a_webhook_to_a_private_address_or_a_redirect_is_refused(researcher, receiver, sent, settings):
    AlertSettings.objects.create(user=researcher, webhook_url=receiver)
    (alert,) = services.raise_alert(researcher, Alert.Event.TEST)
    services.deliver(alert.pk)
    alert.refresh_from_db()
    assert "127.0.0.1 is a private address" in alert.error and Receiver.got == []
    settings.RFTWEB_WEBHOOK_PRIVATE = True
    Receiver.answers = [302]  # to the cloud metadata address: not followed
    Alert.objects.filter(pk=alert.pk).update(next_attempt_at=timezone.now())
    services.deliver(alert.pk)
    alert.refresh_from_db()
    assert "answered 302" in alert.error and len(Receiver.got) == 1


@pytest.mark.parametrize("host, carried", [
    ("[2002:7f00:1::]", "127.0.0.1"),  # 6to4
    ("[64:ff9b::a00:1]", "10.0.0.1"),  # NAT64, the well-known prefix
    ("[64:ff9b:1::a00:1]", "10.0.0.1"),  # NAT64 local-use, a /96 in it
    ("[64:ff9b:1:a9fe:a9:fe00::]", "169.254.169.254"),  # NAT64 local-use as a /48 (RFC 6052 2.2)
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "192.0.2.45"),  # Teredo: its client
    ("[::7f00:1]", "127.0.0.1"),  # IPv4-compatible
])
def test_an_ipv6_address_that_carries_a_private_ipv4_one_is_refused(host, carried):
    problem = webhook.address_problem(f"http://{host}/hook")
    assert "is a private address" in problem and carried in problem
    with pytest.raises(webhook.WebhookError, match="private address"):
        webhook.post(f"http://{host}/hook", b"{}", secret="", event="test")


def test_an_ipv6_address_that_carries_a_public_ipv4_one_is_let_by():
    assert webhook.address_problem("http://[2002:808:808::]/") is None
    assert webhook.address_problem("http://[64:ff9b::808:808]/") is None


def test_a_port_out_of_range_is_a_problem_not_a_crash(settings):
    for private in (False, True):
        settings.RFTWEB_WEBHOOK_PRIVATE = private
        problem = webhook.address_problem("http://example.com:99999/")
        assert "port 99999" in problem and "0 to 65535" in problem
        with pytest.raises(webhook.WebhookError, match="port 99999"):
            webhook.post("http://example.com:99999/", b"{}", secret="", event="test")


@pytest.mark.django_db
def test_a_stored_url_to_a_6to4_loopback_is_refused_when_sent(researcher, receiver, sent):
    """Saved before the check knew 6to4: the send checks again."""
    AlertSettings.objects.create(user=researcher, webhook_url="http://[2002:7f00:1::]/hook")
    (alert,) = services.raise_alert(researcher, Alert.Event.TEST)
    services.deliver(alert.pk)
    alert.refresh_from_db()
    assert "carries 127.0.0.1" in alert.error and Receiver.got == []


# ---- the settings page ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_settings_page_saves_checks_and_sends_a_test(researcher_client, researcher, sent, receiver, settings):
    url = reverse("alert-settings")
    page = researcher_client.get(url)
    assert page.status_code == 200 and "No alerts yet" in page.content.decode()
    refused = researcher_client.post(url, {"on_finish": "on", "email": "on", "webhook_url": receiver,
                                           "stall_minutes": "0"})
    errors = refused.context["form"].errors
    assert set(errors) == {"address", "webhook_url", "stall_minutes"}
    assert "private address" in errors["webhook_url"][0]
    settings.RFTWEB_WEBHOOK_PRIVATE = True
    saved = researcher_client.post(url, {"on_failure": "on", "email": "on", "address": "r@example.org",
                                         "webhook_url": receiver, "stall_minutes": "30"})
    assert saved.status_code == 302
    prefs = AlertSettings.objects.get(user=researcher)
    researcher.refresh_from_db()
    assert (prefs.on_finish, prefs.on_failure, prefs.stall_minutes, researcher.email) == (False, True, 30,
                                                                                          "r@example.org")
    assert len(prefs.webhook_secret) == 48
    researcher_client.post(reverse("alert-test"))
    assert sorted(Alert.objects.values_list("channel", flat=True)) == ["email", "webhook"]
    Receiver.answers = [500]
    for alert in Alert.objects.all():
        services.deliver(alert.pk)
    history = researcher_client.get(url).content.decode()
    assert "answered 500" in history and "could not be sent" in history
    researcher_client.post(reverse("alert-secret"))
    assert AlertSettings.objects.get(user=researcher).webhook_secret != prefs.webhook_secret


@pytest.mark.django_db
def test_the_settings_page_names_a_bad_port_or_a_private_address(researcher_client, researcher):
    url = reverse("alert-settings")
    for bad in ("http://example.com:99999/", "http://[2002:7f00:1::]/", "http://[64:ff9b::a00:1]/"):
        page = researcher_client.post(url, {"webhook_url": bad})
        assert page.status_code == 200 and list(page.context["form"].errors) == ["webhook_url"]
    assert "port 99999" in researcher_client.post(url, {"webhook_url": "http://example.com:99999/"}
                                                  ).context["form"].errors["webhook_url"][0]


@pytest.mark.django_db
def test_a_bad_email_address_is_said_once(researcher_client, researcher):
    page = researcher_client.post(reverse("alert-settings"), {"email": "on", "address": "not-an-address"})
    assert page.context["form"].errors == {"address": ["Enter a valid email address."]}
    assert not AlertSettings.objects.filter(user=researcher, email=True).exists()


@pytest.mark.django_db
def test_an_annotator_has_no_alerts_page(annotator_client):
    assert annotator_client.get(reverse("alert-settings")).status_code == 403
    assert annotator_client.post(reverse("alert-test")).status_code == 403
