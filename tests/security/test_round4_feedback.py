"""Hostile input round 4, annotation (issue #41 findings 6 and 7), under concurrent requests on
real Postgres. The findings themselves (a second pair kept, a flag's undo keeping a curator's
rejection, every path after a comparison) run on Postgres and SQLite in
tests/contract/test_feedback_contract.py; the page after an error in
tests/e2e/test_annotate_after_errors.py."""
import json
import threading

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

pytestmark = pytest.mark.django_db(transaction=True)
ROUNDS = 5  # each round: two requests released together by a barrier


@pytest.fixture
def pair(researcher):
    run = Run.objects.create(name="race", owner=researcher, config={}, status=Run.Status.RUNNING)
    task = Task.objects.create(taskset=Taskset.objects.create(name="race"), index=0, prompt="2 + 2?", answer="4")
    return [
        Experience.objects.create(
            run=run, task=task, rollout_index=n, group_id="g", prompt_text=task.prompt, response_text=text,
            prompt_ids=[1], response_ids=[2 + n], action_mask=[1], model_version=1,
        )
        for n, text in enumerate(("4", "5"))
    ]


def concurrently(*calls):
    """Run the calls at once (a barrier releases them together); their results, in order."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index, call):
        try:
            barrier.wait()
            results[index] = call()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_one_pair_compared_from_two_tabs_at_once_is_one_verdict_and_never_a_500(annotator, pair):
    """Both tabs' comparisons lock the two rows in id order: one replaces the other, either way
    round, and the unique pair constraint is never what answers (an IntegrityError would be a 500)."""
    a, b = pair
    tabs = []
    for _ in range(2):
        tab = Client()
        tab.force_login(annotator)
        tabs.append(tab)

    def compare(tab, shown, other, verdict):
        url = reverse("annotate-api-judge", kwargs={"pk": shown.pk, "action": "compare"})
        body = json.dumps({"other": other.pk, "verdict": verdict})
        return lambda: tab.post(url, body, content_type="application/json")

    verdicts = set()
    for _ in range(ROUNDS):
        answers = concurrently(compare(tabs[0], a, b, "a_better"), compare(tabs[1], b, a, "a_better"))
        assert [r.status_code for r in answers] == [200, 200], [r.content[:300] for r in answers]
        assert [r.json()["message"] is None for r in answers].count(True) <= 1  # the later one says it replaced
        (verdict,) = Feedback.objects.filter(kind="preference").values_list("experience_id", "other_id")
        verdicts.add(verdict)
    assert verdicts <= {(a.pk, b.pk), (b.pk, a.pk)}
