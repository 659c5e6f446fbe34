"""State changes of the buffer."""
from django.db import transaction

from .models import Experience


@transaction.atomic
def write_rollouts(experiences: list[Experience]) -> int:
    """Insert rollouts; a row whose natural key (run, explorer step, task, rollout index) already
    exists is skipped, so a replayed explorer step writes nothing twice. Returns rows inserted."""
    before = Experience.objects.filter(run_id__in={e.run_id for e in experiences}).count()
    Experience.objects.bulk_create(experiences, ignore_conflicts=True, batch_size=500)
    return Experience.objects.filter(run_id__in={e.run_id for e in experiences}).count() - before
