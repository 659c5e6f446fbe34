"""Data migrations of the feedback app, run on real rows."""
import pytest

from apps.runs.models import Run
from tests.support import migrate_to, migrate_to_newest

BEFORE, AFTER = ("feedback", "0006_preference_use_count"), ("feedback", "0007_pair_use_per_run")


@pytest.mark.django_db(transaction=True)
def test_a_preferences_uses_become_those_of_the_run_it_was_made_on(researcher):
    """Feedback.use_count counted every run's uses together; PairUse counts them per run. Who used
    a pair was not recorded: the run it was made on is the usual reader (a mode both DPO run)."""
    old = migrate_to(BEFORE)
    Experience, Feedback = old.get_model("buffer", "Experience"), old.get_model("feedback", "Feedback")
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")  # runs stays migrated
    a, b, c, d = (Experience.objects.create(run_id=run.pk if i < 3 else None, rollout_index=i, source="rollout")
                  for i in range(4))
    used = Feedback.objects.create(experience=a, other=b, user_id=researcher.pk, kind="preference", value=1.0,
                                   use_count=2)
    Feedback.objects.create(experience=b, other=c, user_id=researcher.pk, kind="preference", value=1.0)  # unused
    Feedback.objects.create(experience=d, other=d, user_id=researcher.pk, kind="preference", value=1.0,
                            use_count=1)  # imported data: trained on in the runs' copies
    try:
        PairUse = migrate_to(AFTER).get_model("feedback", "PairUse")
        assert list(PairUse.objects.values_list("run", "preference", "uses")) == [(run.pk, used.pk, 2)]
    finally:
        migrate_to_newest()
