"""Buffer retention (#29), how it starts and what it leaves: the daily sweep and its settings (beat, the
embedded demo), the Runs admin's actions and who gets them, and a retired run's resume, API and page."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from apps.buffer import retention
from apps.buffer.models import BufferJob, Experience
from apps.core.jobs import run_job
from apps.feedback.models import Feedback
from apps.runs import services as run_services
from apps.runs.models import Run
from tests.apps.buffer.retention.support import ids, remaining, retire

Status = Run.Status
RUNS = "/admin/runs/run/"
ROOT = Path(__file__).resolve().parents[4]  # the repository


# ---- the daily sweep and its settings ----


def test_the_sweep_takes_the_runs_past_the_cutoff_once(settings, make_run, make_experience, annotator):
    settings.RFTWEB_BUFFER_RETENTION_DAYS = 30
    settings.RFTWEB_BUFFER_RETENTION_ACTION = "drop"
    old, failed = make_run("old", days_ago=40), make_run("failed", status=Status.FAILED, days_ago=31)
    recent, running = make_run("recent", days_ago=10), make_run("running", status=Status.RUNNING)
    done = make_run("done", status=Status.COMPLETED, days_ago=90)  # only rows that stay
    for run in (old, failed, recent, running):
        make_experience(run=run)
    make_experience(run=done, source=Experience.Source.HUMAN_EDIT)
    Feedback.objects.create(experience=make_experience(run=done), user=annotator, kind="rating", value=1.0)

    job = retention.sweep()

    assert job.params["runs"] == [old.pk, failed.pk] and job.params["action"] == "drop" and job.created_by is None
    assert retention.sweep() is None, "a run whose job is queued is not taken again"
    later = make_run("later", days_ago=35)
    make_experience(run=later)
    assert retention.sweep().params["runs"] == [later.pk], "nor does it keep a newly due run waiting"
    run_job("buffer.bufferjob", job.pk)
    assert retention.sweep() is None, "nor once its rows are gone"
    assert set(Experience.objects.values_list("run__name", flat=True)) == {"recent", "running", "done", "later"}
    settings.RFTWEB_BUFFER_RETENTION_DAYS = 5
    assert retention.sweep().params["runs"] == [recent.pk]
    settings.RFTWEB_BUFFER_RETENTION_DAYS = 0
    BufferJob.objects.all().delete()
    assert retention.sweep() is None, "0 days: off"


def test_a_failed_job_leaves_its_runs_to_the_next_sweep(settings, ended, buffer, monkeypatch):
    settings.RFTWEB_BUFFER_RETENTION_DAYS = 30
    job = retention.sweep()
    BufferJob.objects.filter(pk=job.pk).update(status=BufferJob.Status.FAILED)
    again = retention.sweep()
    assert ended.pk in again.params["runs"] and again.pk != job.pk
    ended.refresh_from_db()
    assert ended.buffer_retirement["job"] == again.pk


def test_beat_schedules_the_sweep(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["buffer-retention"]
    assert entry == {"task": "workers.tasks.buffer_retention", "schedule": 24 * 3600.0}
    from workers.tasks import buffer_retention

    assert buffer_retention.name == entry["task"]


def test_embedded_a_thread_of_the_demo_sweeps_every_interval(settings, monkeypatch):
    """No beat without Redis: the demo command's thread sweeps at start, then every interval, and a
    failing sweep does not end it."""
    from apps.runs.management.commands import demo

    settings.RFTWEB_BUFFER_RETENTION_INTERVAL = 123.0
    events = []

    class Stop(BaseException):
        pass

    def sweep():
        events.append("sweep")
        if len(events) == 1:
            raise RuntimeError("database away")

    def sleep(seconds):
        events.append(seconds)
        if events.count(seconds) == 2:
            raise Stop

    monkeypatch.setattr(demo.retention, "sweep", sweep)
    monkeypatch.setattr(demo.time, "sleep", sleep)
    monkeypatch.setattr(demo, "connection", type("Connection", (), {"close": lambda self: events.append("closed")})())
    with pytest.raises(Stop):
        demo.repeat(settings.RFTWEB_BUFFER_RETENTION_INTERVAL, demo.retention.sweep, "buffer retention")
    assert events == ["sweep", "closed", 123.0, "sweep", "closed", 123.0]


def settings_import(**env) -> subprocess.CompletedProcess:
    """Import the settings module in a fresh process with these variables set."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RFTWEB_BUFFER_RETENTION")}
    return subprocess.run([sys.executable, "-c", "import rftweb.settings"], cwd=ROOT, capture_output=True,
                          text=True, env=environ | {"SECRET_KEY": "x", **env}, timeout=60)


@pytest.mark.parametrize("name, value", [
    ("RFTWEB_BUFFER_RETENTION_DAYS", "thirty"),
    ("RFTWEB_BUFFER_RETENTION_DAYS", "-1"),
    ("RFTWEB_BUFFER_RETENTION_DAYS", "nan"),
    ("RFTWEB_BUFFER_RETENTION_ACTION", "delete"),
    ("RFTWEB_BUFFER_RETENTION_INTERVAL", "0"),
])
def test_a_bad_retention_setting_stops_the_start_naming_the_variable(name, value):
    started = settings_import(**{name: value})
    assert started.returncode != 0 and f"RuntimeError: {name} must be" in started.stderr, started.stderr
    assert repr(value) in started.stderr


def test_good_retention_settings_start():
    started = settings_import(RFTWEB_BUFFER_RETENTION_DAYS="90", RFTWEB_BUFFER_RETENTION_ACTION="Drop",
                              RFTWEB_BUFFER_RETENTION_INTERVAL="3600")
    assert started.returncode == 0, started.stderr


# ---- the Runs admin's actions ----


def post_action(client, action, runs, *, confirm=False):
    data = {"action": action, "_selected_action": [str(run.pk) for run in runs], "select_across": 0}
    if not confirm:
        return client.post(RUNS, data | {"index": 0})
    return client.post(RUNS, data | {"confirm": "yes", "through": max(run.pk for run in runs)})


def test_the_archive_action_asks_first_then_starts_the_job(curator_client, ended, buffer):
    page = post_action(curator_client, "archive_buffer", [ended])
    assert page.status_code == 200 and "Yes, archive the buffer" in page.content.decode()
    assert "Human edits" in page.content.decode() and not BufferJob.objects.exists()
    held = Experience.objects.filter(run=ended).count()
    assert f"{len(buffer['doomed'])} of the {held} experiences in their buffer go." in page.content.decode()

    started = post_action(curator_client, "archive_buffer", [ended], confirm=True)

    job = BufferJob.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("admin:buffer_bufferjob_change",
                                                                         args=[job.pk])
    progress_page = curator_client.get(started["Location"]).content.decode()
    assert "job_progress.js" in progress_page and reverse("job-progress", args=["buffer.bufferjob", job.pk]) in (
        progress_page)
    assert job.params["action"] == "archive" and job.created_by.username == "cur"
    run_job("buffer.bufferjob", job.pk)
    assert remaining() == ids(buffer["kept"])
    assert "retention job" in curator_client.get(reverse("admin:runs_run_change", args=[ended.pk])).content.decode()


def test_the_drop_action_refuses_runs_that_have_not_ended(curator_client, ended, make_run, make_experience):
    running = make_run("still going", status=Status.RUNNING)
    rows = ids([make_experience(run=running), make_experience(run=ended)])

    response = post_action(curator_client, "drop_buffer", [ended, running])
    assert response.status_code == 302
    page = curator_client.get(response["Location"]).content.decode()
    assert f"still going (#{running.pk}, running)" in page and "Nothing was started" in page
    # And at confirmation, should it have started meanwhile (checked again under the run's lock).
    Run.objects.filter(pk=running.pk).update(status=Status.STOPPED, finished_at=timezone.now())
    assert post_action(curator_client, "drop_buffer", [ended, running]).status_code == 200
    Run.objects.filter(pk=running.pk).update(status=Status.RUNNING, finished_at=None)
    post_action(curator_client, "drop_buffer", [ended, running], confirm=True)
    assert remaining() == rows and not BufferJob.objects.exists()


@pytest.mark.parametrize("who", ["annotator", "researcher"])
def test_annotators_and_researchers_never_reach_the_actions(client, who, request, ended, make_experience):
    rows = ids([make_experience()])
    client.force_login(request.getfixturevalue(who))
    response = post_action(client, "drop_buffer", [ended], confirm=True)
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    assert remaining() == rows and not BufferJob.objects.exists()


def test_only_who_may_delete_experiences_gets_the_actions(client, curator_client, ended, make_experience,
                                                        django_user_model):
    def offered(client) -> set[str]:
        form = client.get(RUNS).context["action_form"]  # None: no action at all
        return {name for name, _ in form.fields["action"].choices} if form else set()

    rows = ids([make_experience()])
    assert {"archive_buffer", "drop_buffer"} <= offered(curator_client)
    viewer = django_user_model.objects.create_user("viewer", password="pw-for-tests-123", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=["view_run", "change_run", "delete_run"]))
    client.force_login(viewer)
    assert offered(client) == {"", "delete_selected"}  # "---------", and deleting runs: another permission

    post_action(client, "drop_buffer", [ended], confirm=True)

    assert remaining() == rows and not BufferJob.objects.exists()


# ---- a retired run is never resumed ----


def test_a_retired_run_refuses_resume_and_says_why(ended, buffer, client, researcher, curator):
    job = retire(ended, "archive")
    day = f"{timezone.now():%Y-%m-%d}"
    reason = (f"run {ended.pk} cannot be resumed: its buffer was archived on {day} by buffer retention "
              f"(buffer job {job.pk}); launch a new run from its config (Launch again)")

    with pytest.raises(run_services.InvalidTransition) as refused:
        run_services.resume_run(ended)
    assert str(refused.value) == reason
    ended.refresh_from_db()
    assert ended.status == Status.STOPPED and ended.resumes == []

    client.force_login(researcher)
    api = client.post(reverse("api-run-resume", args=[ended.pk]))
    assert api.status_code == 409 and api.json()["error"] == reason
    detail = client.get(reverse("api-run", args=[ended.pk])).json()
    assert detail["buffer_retired"]["action"] == "archive" and detail["buffer_retired"]["job"] == job.pk
    page = client.get(reverse("run-detail", args=[ended.pk])).content.decode()
    job_url = reverse("admin:buffer_bufferjob_change", args=[job.pk])
    assert 'id="run-buffer-retired"' in page and f"archived on {day}" in page
    assert reverse("run-resume", args=[ended.pk]) not in page and job_url not in page  # no admin for researchers
    rollouts = client.get(reverse("run-rollouts", args=[ended.pk])).content.decode()
    assert 'id="rollouts-buffer-retired"' in rollouts and f"its buffer was archived on {day}" in rollouts
    client.force_login(curator)
    page = client.get(reverse("run-detail", args=[ended.pk])).content.decode()
    assert job_url in page and "downloads the archive" in page
    assert reverse("run-resume", args=[ended.pk]) not in page


