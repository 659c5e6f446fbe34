"""Fixtures of the buffer retention tests: an ended run and its buffer, by what retention does with each row."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.models import AnnotationLock, Feedback
from apps.runs.models import Run

Status = Run.Status


@pytest.fixture
def ended(run):
    """The buffer conftest's run, stopped 40 days ago."""
    Run.objects.filter(pk=run.pk).update(status=Status.STOPPED, finished_at=timezone.now() - timedelta(days=40))
    run.refresh_from_db()
    return run


@pytest.fixture
def make_run(researcher):
    def make(name, status=Status.STOPPED, days_ago=40):
        finished = timezone.now() - timedelta(days=days_ago) if status in Run.FINISHED else None
        return Run.objects.create(name=name, owner=researcher, config={}, status=status, finished_at=finished)

    return make


@pytest.fixture
def buffer(ended, make_experience, make_run, annotator):
    """An ended run's rows, by what retention does with them, and rows that are not the run's."""
    rollouts = [make_experience() for _ in range(5)]
    rated, compared, flagged = make_experience(), make_experience(), make_experience()
    doomed = [
        *rollouts,
        make_experience(source=Experience.Source.SYNTHETIC),
        make_experience(source=Experience.Source.EXPERT),  # the run's expert rows (promoted copies)
    ]
    edit = make_experience(source=Experience.Source.HUMAN_EDIT, parent=rollouts[0])  # its parent goes
    Feedback.objects.create(experience=rated, user=annotator, kind="rating", value=1.0)
    Feedback.objects.create(experience=rollouts[1], user=annotator, kind="preference", other=compared, value=1.0)
    Feedback.objects.create(experience=flagged, user=annotator, kind="flag")
    AnnotationLock.objects.create(experience=rollouts[2], user=annotator, expires_at=timezone.now())
    other_run = make_run("other", days_ago=400)
    others = [make_experience(run=other_run), make_experience(run=None, task=None, source="expert")]
    # rollouts[1] has feedback (a preference) itself: it stays too
    doomed.remove(rollouts[1])
    return {
        "doomed": doomed,
        "kept": [rollouts[1], rated, compared, flagged, edit, *others],
        "edit": edit,
        "other_run": other_run,
    }
