import math

import numpy as np
import pytest
from django.db import IntegrityError, transaction

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


@pytest.fixture
def task(db):
    taskset = Taskset.objects.create(name="ts")
    return Task.objects.create(taskset=taskset, index=0, prompt="1+1?", answer="2")


def rollout(run, task, step=0, index=0, **fields):
    return Experience(run=run, task=task, explorer_step=step, rollout_index=index, **fields)


def test_duplicate_natural_key_is_refused(run, task):
    rollout(run, task).save()
    with pytest.raises(IntegrityError), transaction.atomic():
        rollout(run, task).save()
    assert Experience.objects.count() == 1


def test_natural_key_only_binds_rollouts(run, task):
    parent = rollout(run, task)
    parent.save()
    # A human edit of that rollout shares its step, task and index; it is a different experience.
    rollout(run, task, source=Experience.Source.HUMAN_EDIT, parent=parent).save()
    assert Experience.objects.count() == 2


# A replayed explorer step writing nothing twice: test_store.test_write_is_idempotent_per_natural_key.


def test_token_arrays_round_trip_exactly(run, task):
    rng = np.random.default_rng(0)
    prompt_ids = rng.integers(0, 2**31 - 1, size=300).tolist() + [0, 2**31 - 1]
    response_ids = rng.integers(0, 150_000, size=1000).tolist()
    mask = rng.integers(0, 2, size=1000).tolist()
    logprobs = np.float32(rng.normal(-2, 1, size=1000)).tolist() + [-math.inf, 0.0]
    exp = rollout(run, task, prompt_ids=prompt_ids, response_ids=response_ids, action_mask=mask, logprobs=logprobs)
    exp.save()
    stored = Experience.objects.get(pk=exp.pk)
    assert stored.prompt_ids == prompt_ids
    assert stored.response_ids == response_ids
    assert stored.action_mask == mask
    assert stored.logprobs == logprobs  # float32 values come back bit for bit
    # 4 bytes a token, not a JSON list (SQLite's length() of a blob, Postgres's octet_length of bytea).
    with transaction.atomic():
        from django.db import connection

        size = "length" if connection.vendor == "sqlite" else "octet_length"
        with connection.cursor() as cursor:
            cursor.execute(f"select {size}(response_ids) from buffer_experience where id = %s", [exp.pk])
            assert cursor.fetchone()[0] == 4000


def test_empty_and_missing_arrays(run, task):
    exp = rollout(run, task, response_ids=[], logprobs=None)
    exp.save()
    stored = Experience.objects.get(pk=exp.pk)
    assert stored.response_ids == [] and stored.logprobs is None


def test_packed_field_rejects_floats_for_token_ids(run, task):
    with pytest.raises(ValueError, match="response_ids: expected integers"):
        rollout(run, task, response_ids=[1.5, 2.0]).save()


def test_one_feedback_per_experience_user_and_kind(run, task, annotator):
    exp = rollout(run, task)
    exp.save()
    Feedback.objects.create(experience=exp, user=annotator, kind="rating", value=1.0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Feedback.objects.create(experience=exp, user=annotator, kind="rating", value=0.0)


def test_preference_needs_the_other_experience(run, task, annotator):
    exp = rollout(run, task)
    exp.save()
    with pytest.raises(IntegrityError), transaction.atomic():
        Feedback.objects.create(experience=exp, user=annotator, kind="preference")


def test_metric_point_is_one_row_per_role_and_step(run):
    run.metrics.create(role="trainer", step=1, values={"loss": 1.0, "kl": 0.1})
    with pytest.raises(IntegrityError), transaction.atomic():
        run.metrics.create(role="trainer", step=1, values={"loss": 2.0})
