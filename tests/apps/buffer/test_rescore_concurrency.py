"""A re-score beside the annotators: a rating saved while the job runs keeps its `human` reward
component, and an annotator's save does not wait for the whole job."""
import threading
import time

import pytest
from django.db import connection

from apps.buffer import curation
from apps.buffer.models import Experience
from apps.core.jobs import run_job
from apps.feedback import services as feedback
from tests.support import owner_died
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
        annotator = made[-1]
        reward_fn(RATE_MEANWHILE)(lambda response, task: annotator.score(response, task))
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


def test_an_annotators_save_waits_for_no_more_than_a_chunk_of_the_rescore(
    make_experience, annotator, annotator_meanwhile, monkeypatch
):
    """One transaction over the whole job: on SQLite (one writer) the rating waited for the whole
    job, 30 s, then failed 'database is locked'; on Postgres for the rows already written."""
    monkeypatch.setattr("apps.buffer.services.CHUNK_ROWS", 2)
    rows = [make_experience() for _ in range(6)]
    # Rows 0 and 1 are written when the job scores row 3: the rating of row 0 comes then.
    meanwhile = annotator_meanwhile(annotator, rows[0].pk, patience=5.0, at_call=3)

    rescore(rows)

    meanwhile.thread.join()
    assert meanwhile.errors == []
    assert meanwhile.seconds < 5.0  # saved while the job scored: it did not wait for its end
    assert Experience.objects.get(pk=rows[0].pk).reward_components["human"] == 1.0


class Killed(BaseException):
    """The worker's process dying mid-job: no handler of the job's runs."""


def test_a_rescore_run_again_after_its_worker_died_midway_goes_on_from_its_committed_chunks(
    make_experience, monkeypatch
):
    """Committed a chunk at a time, a re-run must not rescore the rows done again: their previous
    reward would be the rescored one, the original lost."""
    monkeypatch.setattr("apps.buffer.services.CHUNK_ROWS", 2)
    rows = [make_experience(reward=0.25) for _ in range(4)]
    calls = []

    def dies_at_the_third_row(response, task):
        calls.append(response)
        if len(calls) == 3:
            raise Killed
        return 0.5

    dies_at_the_third_row.rules = {}
    monkeypatch.setitem(REWARD_FNS._entries, RATE_MEANWHILE, dies_at_the_third_row)
    job = curation.start_rescore(Experience.objects.filter(pk__in=[row.pk for row in rows]), reward_fn=RATE_MEANWHILE)
    with pytest.raises(Killed):
        run_job("buffer.bufferjob", job.pk)
    assert [row.reward for row in Experience.objects.order_by("pk")] == [0.5, 0.5, 0.25, 0.25]
    owner_died(job)

    job = run_job("buffer.bufferjob", job.pk)  # Celery's redelivery

    assert (job.status, job.result["rescored"]) == ("succeeded", 4)
    assert len(calls) == 3 + 2  # the two rows committed before were not scored again
    for row in Experience.objects.all():
        assert (row.reward, row.metadata["rescored"]["previous_reward"]) == (0.5, 0.25)


def test_a_step_that_samples_a_group_while_its_advantages_are_recomputed_trains_with_the_stored_one(
    make_experience, tasks, monkeypatch
):
    """The recompute read the rows' status unlocked and wrote their advantages later: a trainer step
    that sampled a row in between trained with the old advantage while the row said the new one."""
    from apps.buffer.store import DjangoExperienceBuffer

    rows = [make_experience(task=tasks[2], group_id="7-2", response_text=text, reward=0.0, advantage=0.0)
            for text in ("4", "The answer is 4.", "5", "I do not know")]
    in_window, go, real = threading.Event(), threading.Event(), curation._advantages

    def paused(group, *args):  # between the recompute's read of the group and its write
        in_window.set()
        go.wait(10)
        return real(group, *args)

    monkeypatch.setattr(curation, "_advantages", paused)
    sampled, errors = [], []

    def in_thread(work):
        def run():
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))
            finally:
                connection.close()
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    job = curation.start_rescore(Experience.objects.filter(pk__in=[rows[0].pk, rows[1].pk]), reward_fn="exact_match")
    rescoring = in_thread(lambda: run_job("buffer.bufferjob", job.pk))
    assert in_window.wait(10)
    step = in_thread(lambda: sampled.extend(DjangoExperienceBuffer(rows[0].run_id).sample(4, sources=("rollout",))))
    time.sleep(1.0)  # the step's claim, had it not to wait, is done
    go.set()
    rescoring.join(30)
    step.join(30)

    assert errors == []
    stored = dict(Experience.objects.values_list("pk", "advantage"))
    assert {e.id: e.advantage for e in sampled} == {e.id: stored[e.id] for e in sampled}
    assert sorted(stored.values()) != [0.0] * 4, "the recompute wrote the new advantages"


def test_a_rescore_whose_reward_fn_fails_midway_recomputes_the_done_groups_and_says_what_it_did(
    make_experience, tasks, monkeypatch
):
    """Its committed chunks kept their new rewards beside the old advantages, and its error named
    only the failing row."""
    monkeypatch.setattr("apps.buffer.services.CHUNK_ROWS", 2)
    rows = [make_experience(task=tasks[2], group_id="7-2", response_text=text, reward=0.0, advantage=0.0)
            for text in ("4", "5", "4", "5")]
    calls = []

    def fails_at_the_third_row(response, task):
        calls.append(response)
        if len(calls) == 3:
            raise ValueError("the judge is down")
        return 1.0 if response == "4" else 0.0

    fails_at_the_third_row.rules = {}
    monkeypatch.setitem(REWARD_FNS._entries, RATE_MEANWHILE, fails_at_the_third_row)
    job = curation.start_rescore(Experience.objects.filter(pk__in=[row.pk for row in rows]), reward_fn=RATE_MEANWHILE)

    job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "failed" and job.error.endswith(
        "; the 2 rows before it were rescored (each says so in its metadata) and their groups' advantages recomputed")
    stored = list(Experience.objects.order_by("pk").values_list("reward", "advantage"))
    assert [reward for reward, _ in stored] == [1.0, 0.0, 0.0, 0.0]
    assert stored[0][1] > 0 > stored[1][1], "the group's advantages follow its rewards now"
