"""A run that trains on other runs' judgements (feedback.source_runs) while those runs have none
yet launched without a word, then waited. The launch now says which source runs have nothing
for it and what the run does meanwhile (config_checks.source_run_warnings): a warning, not a
refusal, on the launch page and in the API's answer."""
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from workers.rft.config import RunConfig

from .test_config_refusals import api, source_run
from .test_launch import config_form, posted

pytestmark = pytest.mark.django_db
SAME = {"mode": "train", "model": {"path": "tiny"}, "explorer": {"use_chat_template": False},
        "buffer": {"taskset": "addition"}}


@pytest.fixture(autouse=True)
def embedded(settings):
    settings.RFTWEB_EMBEDDED = True  # no word on the workers' free slots


def answers(run: Run, n: int) -> list[Experience]:
    return [Experience.objects.create(run=run, source="rollout", explorer_step=0, rollout_index=i, group_id="g",
                                      response_text=f"answer {i}", prompt_ids=[1], response_ids=[2 + i],
                                      action_mask=[1], logprobs=[-0.5]) for i in range(n)]


def test_a_dpo_run_on_source_runs_without_comparisons_is_told_it_will_wait(researcher, researcher_client, tasksets,
                                                                           worker_queue):
    demo = source_run(researcher)
    dpo = {**SAME, "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [demo.pk]}}
    response = api(researcher, dpo)
    assert response.status_code == 201
    warning = (f"feedback.source_runs: run {demo.pk} ('demo') has no preference pairs yet (comparisons with a "
               "verdict, neither response flagged): this run's trainer waits for the first pair from it, counting no "
               "step, and its duty line says so.")
    assert response.json()["warnings"] == [warning]
    form = config_form(RunConfig.from_dict(dpo).to_dict(), name="on the form")
    page = researcher_client.post(reverse("run-launch"), posted(form), follow=True)
    assert page.status_code == 200 and warning.replace("'", "&#x27;") in page.content.decode()
    assert Run.objects.filter(name="on the form").exists()  # warned, not refused

    chosen, rejected = answers(demo, 2)
    tie = Feedback.objects.create(experience=chosen, other=rejected, user=researcher, kind="preference", value=0.5)
    assert api(researcher, dpo).json()["warnings"] == [warning]  # a tie is no pair
    Feedback.objects.filter(pk=tie.pk).update(value=1.0)
    assert api(researcher, dpo).json()["warnings"] == []


def test_an_sft_run_is_told_which_source_runs_have_no_edits_and_what_it_trains_on_meanwhile(researcher, tasksets,
                                                                                            worker_queue):
    demo, other = source_run(researcher), source_run(researcher)
    Run.objects.filter(pk=other.pk).update(name="other")
    sft = {**SAME, "algorithm": {"name": "sft"}, "feedback": {"source_runs": [demo.pk, other.pk]}}
    assert api(researcher, sft).json()["warnings"] == [
        f"feedback.source_runs: run {demo.pk} ('demo'), run {other.pk} ('other') have no human edits ready yet: "
        "this run's trainer waits for the first edit from them, counting no step, and its duty line says so."]
    (edited,) = answers(other, 1)
    Experience.objects.create(run=other, source="human_edit", parent=edited, explorer_step=0, prompt_ids=[1],
                              response_ids=[5], action_mask=[1])
    assert api(researcher, sft).json()["warnings"] == [
        f"feedback.source_runs: run {demo.pk} ('demo') has no human edits ready yet: this run trains on what the "
        "other source runs have meanwhile."]
    Experience.objects.filter(run=other, source="human_edit").update(status="rejected")  # flagged: never sampled
    with_taskset = {**sft, "buffer": {"taskset": "addition", "expert_taskset": "addition"}}
    assert api(researcher, with_taskset).json()["warnings"] == [
        f"feedback.source_runs: run {demo.pk} ('demo'), run {other.pk} ('other') have no human edits ready yet: "
        "until they have some, this run trains on the answers of taskset 'addition' alone."]


def test_a_mode_both_dpo_run_waits_for_its_own_annotators_too(researcher, tasksets, worker_queue):
    demo = source_run(researcher)
    dpo = {**SAME, "mode": "both", "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [demo.pk],
                                                                             "exclude_flagged": False}}
    assert api(researcher, dpo).json()["warnings"] == [
        f"feedback.source_runs: run {demo.pk} ('demo') has no preference pairs yet (comparisons with a verdict): "
        "this run's trainer waits for the first pair from it or from annotators' judgements of this run's answers, "
        "counting no step, and its duty line says so."]


def test_the_warning_counts_what_a_source_runs_reviewers_have_yet_to_accept(researcher, tasksets, worker_queue):
    """A source run that requires review holds verdicts no reviewer accepted yet: they train once
    accepted, and the warning says how many wait, so the researcher knows whom to ask."""
    demo = source_run(researcher)
    dpo = {**SAME, "algorithm": {"name": "dpo"}, "feedback": {"source_runs": [demo.pk]}}
    chosen, rejected, third = answers(demo, 3)
    for other in (rejected, third):
        Feedback.objects.create(experience=chosen, other=other, user=researcher, kind="preference", value=1.0,
                                review="pending")
    Feedback.objects.create(experience=rejected, other=third, user=researcher, kind="preference", value=0.5,
                            review="pending")  # a tie waits too, and is no pair
    assert api(researcher, dpo).json()["warnings"] == [
        f"feedback.source_runs: run {demo.pk} ('demo', 2 comparisons waiting for a reviewer) has no preference pairs "
        "yet (comparisons with a verdict, neither response flagged): this run's trainer waits for the first pair "
        "from it, counting no step, and its duty line says so."]
