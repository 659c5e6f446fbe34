"""Fixtures the apps' tests share."""
import pytest
from django.utils import timezone

from apps.runs.models import Run


@pytest.fixture
def make_run(researcher):
    """A run in `status`; an active one (running, paused...) is held by a live worker, as it would
    be (pass heartbeats={} for one whose worker is gone)."""

    def make(name="run", *, owner=None, status=Run.Status.QUEUED, config=None, **fields):
        config = {"trainer": {"total_steps": 100}} if config is None else config
        if status in Run.ACTIVE and status != Run.Status.STARTING:
            fields.setdefault("heartbeats", {"loop": {"at": timezone.now().isoformat(), "worker": "test-worker"}})
        return Run.objects.create(name=name, owner=owner or researcher, status=status, config=config, **fields)

    return make
