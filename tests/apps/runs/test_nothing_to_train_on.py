"""A run with nothing to train on, as its page shows it (before, it "completed" 100 skipped steps at
once, model v100, trained on nothing, without a word). The launch page's "DPO from human
preferences" preset, launched as it opens (on the tiny model, which a CPU runs in seconds), trains
on annotators' comparisons of the run's own answers: until the first comes its trainer waits, the
duty line saying so, and no trainer step is counted or charted; one comparison later it trains on
the pair, once (algorithm.dpo.max_pair_uses: 1 in mode both; least used first alone trained that
one pair in every step), then waits for the next comparison, saying why (embedded: the run's
duties are threads of this process, over the test database). Steps
that counted with nothing to train on (on rollouts all filtered out) are named on the page."""
import threading

import pytest
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback import services as feedback
from apps.feedback.models import PairUse
from apps.runs import services, waits
from apps.runs.models import MetricPoint, Run
from apps.tasksets.services import BUILTIN_TASKSETS, create_generated_taskset
from tests.support import wait_for

from .test_launch import posted

Status = Run.Status


def trainer_line(run: Run) -> str:
    """What the run page's duty line says the loop does (waits.duty_states, from its heartbeat)."""
    (loop,) = waits.duties_json(Run.objects.get(pk=run.pk))["duties"]
    return " · ".join(part["what"] for part in loop["doing"] if part["role"] == "trainer")


def a_pair_to_compare(run: Run, besides=()) -> tuple[Experience, Experience]:
    """Two different answers of the run to one prompt, as Annotate's compare shows them (none of
    the experiences `besides`)."""
    answers = {}
    for row in Experience.objects.filter(run=run, source="rollout").exclude(pk__in=besides).order_by("pk"):
        for other in answers.get(row.task_id, []):
            if other.response_text != row.response_text:
                return other, row
        answers.setdefault(row.task_id, []).append(row)
    raise AssertionError("no two different answers to one prompt")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(900)
def test_the_dpo_preset_waits_for_annotators_saying_so_and_trains_on_each_comparison_once(
    researcher, annotator, settings
):
    settings.RFTWEB_EMBEDDED = True
    spec = next(spec for spec in BUILTIN_TASKSETS if spec.name == "arithmetic")
    create_generated_taskset(spec)
    client = Client()
    client.force_login(researcher)
    form = client.get(reverse("run-launch"), {"preset": "dpo-human"}).context["form"]
    response = client.post(reverse("run-launch"), posted(form, name="people's pairs", **{
        "model.path": "tiny", "explorer.max_new_tokens": "8", "trainer.batch_size": "1",
        "trainer.micro_batch_size": "2"}))
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.get()
    assert (run.mode, run.config["algorithm"]["name"]) == ("both", "dpo")
    try:
        wait_for(lambda: "waiting for data" in trainer_line(run), 300, "the trainer to wait for a pair")
        assert trainer_line(run) == ("waiting for data: nothing to train on yet from annotators' comparisons of "
                                     "this run's answers (Annotate, c)")
        run.refresh_from_db()
        assert (run.status, run.trainer_step) == ("running", 0)
        assert not MetricPoint.objects.filter(run=run, role="trainer").exists()

        chosen, rejected = a_pair_to_compare(run)
        feedback.compare(chosen.pk, rejected.pk, annotator, "a_better")
        wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 1, 300, "a trainer step on the pair")
        first = MetricPoint.objects.get(run=run, role="trainer", step=1).values
        assert first["pairs"] == 1 and "skipped" not in first

        wait_for(lambda: "every pair" in trainer_line(run), 300, "the trainer to wait for a new pair")
        assert trainer_line(run) == ("waiting for data: every pair so far has trained in 1 step "
                                     "(algorithm.dpo.max_pair_uses), the most it may; new ones come from annotators' "
                                     "comparisons of this run's answers (Annotate, c)")
        assert Run.objects.get(pk=run.pk).trainer_step == 1
        assert PairUse.objects.get(run=run).uses == 1
        second = a_pair_to_compare(run, besides=(chosen.pk, rejected.pk))
        feedback.compare(second[0].pk, second[1].pk, annotator, "b_better")
        wait_for(lambda: Run.objects.get(pk=run.pk).trainer_step >= 2, 300, "a trainer step on the new pair")
        assert MetricPoint.objects.get(run=run, role="trainer", step=2).values["pairs"] == 1
        assert list(PairUse.objects.filter(run=run).values_list("uses", flat=True)) == [1, 1]
    finally:
        services.stop_run(run)
        wait_for(lambda: not [t for t in threading.enumerate() if "serve_duty" in t.name], 120,
                 "the run's threads to end")
    run.refresh_from_db()
    assert (run.status, run.error) == ("stopped", "")


def test_the_run_page_says_which_trainer_steps_found_nothing_to_train_on(researcher_client, make_run):
    """A run of 100 skipped steps ended "completed" at model v100 with no word (trainer.py,
    Trainer.waits_for_data: steps on rollouts count even when every rollout was filtered out)."""
    run = make_run(status=Status.RUNNING, trainer_step=3, config={"trainer": {"total_steps": 10}})
    url = reverse("run-detail", args=[run.pk])
    assert 'id="run-skipped-steps"' not in researcher_client.get(url).content.decode()
    for step, values in enumerate(({"skipped": 1}, {"loss": 0.5}, {"skipped": 1}), 1):
        services.record_metrics(run, "trainer", step, {**values, "lr": 1e-5})
    html = researcher_client.get(url).content.decode()
    assert ("2 of its 3 trainer steps so far found nothing to train on and changed nothing (trainer/skipped): the "
            "rollouts of the explorer steps they train on were all filtered out") in html

    services.record_metrics(run, "trainer", 2, {"skipped": 1})  # a replayed step: its point replaced
    Run.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    html = researcher_client.get(url).content.decode()
    assert "<strong>This run trained nothing.</strong> All its 3 trainer steps found nothing to train on" in html
