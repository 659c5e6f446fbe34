"""A re-score beside the annotators: a rating saved while the job runs keeps its `human` reward
component."""
import threading
import time

import pytest
from django.db import connection

from apps.buffer import curation
from apps.buffer.models import Experience
from apps.core.jobs import run_job
from apps.feedback import services as feedback
from workers.rft.rewards.base import REWARD_FNS, reward_fn

pytestmark = pytest.mark.django_db(transaction=True)

RATE_MEANWHILE = "test_rate_meanwhile"


class Annotator:
    """Rates one experience on a thread of its own (its own database connection) when the job's
    reward fn scores its `at_call`th row, and waits for that save up to `patience` seconds, so the
    rating lands while the job runs: between its read of a chunk and its write of it."""

    def __init__(self, user, experience_id, patience, at_call):
        self.user, self.experience_id, self.patience, self.at_call = user, experience_id, patience, at_call
        self.thread, self.seconds, self.errors, self.calls = None, None, [], 0

    def rate(self):
        started = time.monotonic()
        try:
            feedback.rate(self.experience_id, self.user, "5")
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))
        finally:
            self.seconds = time.monotonic() - started
            connection.close()

    def score(self, response, task):
        self.calls += 1
        if self.calls == self.at_call:
            self.thread = threading.Thread(target=self.rate)
            self.thread.start()
            self.thread.join(self.patience)
        return 0.5


@pytest.fixture
def annotator_meanwhile():
    made = []

    def make(user, experience_id, patience=10.0, at_call=1):
        made.append(Annotator(user, experience_id, patience, at_call))
        reward_fn(RATE_MEANWHILE)(lambda response, task: made[-1].score(response, task))
        return made[-1]

    yield make
    REWARD_FNS._entries.pop(RATE_MEANWHILE, None)
    for annotator in made:
        if annotator.thread is not None:
            annotator.thread.join()


def rescore(rows):
    job = curation.start_rescore(Experience.objects.filter(pk__in=[row.pk for row in rows]), reward_fn=RATE_MEANWHILE)
    job = run_job("buffer.bufferjob", job.pk)
    assert job.status == "succeeded", job.error
    return job


def test_a_rating_saved_while_the_rescore_scores_keeps_its_human_component(
    make_experience, annotator, annotator_meanwhile
):
    """The job read the rows unlocked, scored them, then wrote reward_components whole: the
    rating's `human` saved in between was overwritten (Postgres: {'test_rate_meanwhile': 0.5})."""
    row = make_experience()
    meanwhile = annotator_meanwhile(annotator, row.pk)

    rescore([row])

    meanwhile.thread.join()
    assert meanwhile.errors == []
    row.refresh_from_db()
    assert row.reward_components == {RATE_MEANWHILE: 0.5, "human": 1.0}
    assert row.reward == 0.5

