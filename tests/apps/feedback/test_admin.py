"""Judgements in the admin are read and exported, never added, changed or deleted there: the
admin's plain delete left a deleted rating in the experience's human reward (still training) and a
deleted flag's experience rejected; a changed rating never reached the reward; Add took a rating of
99 (a review found these). The same holds for the runs' metric points."""
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback import services
from apps.feedback.models import Feedback
from apps.runs.models import MetricPoint

pytestmark = pytest.mark.django_db


def test_a_curator_reads_judgements_in_the_admin_and_changes_none(client, curator, annotator, make_experience):
    item = make_experience()
    feedback = services.rate(item.pk, annotator, "4")
    human = Experience.objects.get(pk=item.pk).reward_components["human"]
    client.force_login(curator)
    listing = client.get(reverse("admin:feedback_feedback_changelist"))
    assert listing.status_code == 200 and "export_selection" in listing.content.decode()
    assert "delete_selected" not in listing.content.decode()
    assert client.get(reverse("admin:feedback_feedback_change", args=[feedback.pk])).status_code == 200  # a view
    change = client.post(reverse("admin:feedback_feedback_change", args=[feedback.pk]), {"value": "99"})
    add = client.post(reverse("admin:feedback_feedback_add"), {"value": "99", "kind": "rating"})
    delete = client.post(reverse("admin:feedback_feedback_delete", args=[feedback.pk]), {"post": "yes"})
    assert (change.status_code, add.status_code, delete.status_code) == (403, 403, 403)
    assert Feedback.objects.get().value == feedback.value
    assert Experience.objects.get(pk=item.pk).reward_components["human"] == human


def test_metric_points_are_read_only_in_the_admin(client, curator, run):
    point = MetricPoint.objects.create(run=run, role="trainer", step=1, values={"loss": 1.0})
    client.force_login(curator)
    assert client.get(reverse("admin:runs_metricpoint_add")).status_code == 403
    assert client.post(reverse("admin:runs_metricpoint_change", args=[point.pk]), {"step": "7"}).status_code == 403
    assert MetricPoint.objects.get().step == 1
