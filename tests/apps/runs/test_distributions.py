"""The run page's Distributions panel: quantile bands of the rollouts' reward and length at each
explorer step, binned in the database (apps/runs/distributions.py). On Postgres and SQLite."""
import numpy as np
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.runs.distributions import BINS, MAX_COLUMNS, run_distributions
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={}, status=Run.Status.RUNNING)


def rollouts(run, step, rewards, lengths=None):
    lengths = lengths or [4] * len(rewards)
    Experience.objects.bulk_create(
        Experience(run=run, source="rollout", explorer_step=step, rollout_index=i, reward=reward,
                   prompt_ids=[1], response_ids=[7] * n, action_mask=[1] * n)
        for i, (reward, n) in enumerate(zip(rewards, lengths))
    )


def test_each_steps_quantiles_match_numpys_to_a_bin(run, django_assert_num_queries):
    rng = np.random.default_rng(0)
    drawn = {step: rng.normal(step, 1.0, 200) for step in range(3)}
    for step, rewards in drawn.items():
        rollouts(run, step, rewards.tolist(), lengths=[step + 1] * 200)
    Experience.objects.create(run=run, source="expert", explorer_step=0, reward=99.0)  # not a rollout
    with django_assert_num_queries(3):  # the span and the figures' ranges, then each figure's bins
        found = run_distributions(run)
    assert (found["steps"], found["step_width"], found["rollouts"]) == ([0, 1, 2], 1, 600)
    low = min(r.min() for r in drawn.values())
    high = max(r.max() for r in drawn.values())
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        for step, rewards in drawn.items():
            assert found["figures"]["reward"]["bands"][str(q)][step] == pytest.approx(
                np.quantile(rewards, q), abs=(high - low) / BINS)
    # Every rollout of a step alike: the band is that value.
    assert found["figures"]["response tokens"]["bands"]["0.5"] == pytest.approx([1, 2, 3], abs=2 / BINS)


def test_a_long_run_groups_steps_and_a_run_without_rollouts_has_no_bands(run, researcher):
    for step in range(0, 3 * MAX_COLUMNS, 7):
        rollouts(run, step, [0.0, 1.0])
    found = run_distributions(run)
    assert found["step_width"] == 3 and len(found["steps"]) <= MAX_COLUMNS and found["steps"][:2] == [0, 3]
    bands = found["figures"]["reward"]["bands"]["0.5"]
    assert [b is None for b in bands[:3]] == [False, True, False]  # steps 0, then 7: columns 0 and 2
    empty = Run.objects.create(name="e", owner=researcher, config={})
    assert run_distributions(empty) == {"steps": [], "step_width": 1, "rollouts": 0, "figures": {}}


def test_the_panel_reads_it_as_json_and_annotators_do_not(run, researcher, annotator, client):
    rollouts(run, 0, [0.0, 0.5, 1.0])
    url = reverse("run-distributions", args=[run.pk])
    client.force_login(annotator)
    assert client.get(url).status_code == 403
    client.force_login(researcher)
    answer = client.get(url).json()
    assert answer["active"] and answer["rollouts"] == 3 and set(answer["figures"]) == {"reward", "response tokens"}
    assert 'id="run-distributions"' in client.get(reverse("run-detail", args=[run.pk])).content.decode()
    # It takes no parameters: a script's `?step=5` is refused by name, not answered with every step.
    refused = client.get(url, {"step": "5"})
    assert refused.status_code == 400 and b"takes no query parameters: 'step'" in refused.content
