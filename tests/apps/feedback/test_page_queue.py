"""Without JavaScript, an annotation tab keeps its own queue (apps/feedback/page_queue.py): every
form of the item page posts the page's queue (run, strategy, filter) and the next item is that
queue's, though another tab of the same session started another queue since. A bad queue in an
address is said and the session's queue is used, by the rules the JSON's queue is read by."""
import html
import re

import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback import services
from apps.feedback.models import AnnotationLock, Feedback, SetAside
from apps.runs.models import Run

pytestmark = pytest.mark.django_db

FORM = re.compile(r'<form method="post" action="([^"]*/experience/(\d+)/(\w+)/[^"]*)"')


def forms(page) -> dict[str, str]:
    """The item page's forms without JavaScript: action name -> the address it posts to."""
    return {action: html.unescape(url) for url, _, action in FORM.findall(page.content.decode())}


def shown(client, response):
    """Follow a form's answer to the page it leads to: (the item shown, that page)."""
    assert response.status_code == 302, re.findall(r'role="alert">([^<]*)<', response.content.decode())
    page = client.get(response.url, follow=True)
    address = page.redirect_chain[-1][0] if page.redirect_chain else response.url
    pk = int(re.search(r"/annotate/experience/(\d+)/", address).group(1))
    return Experience.objects.get(pk=pk), page


@pytest.fixture
def two_queues(annotator_client, researcher, run, make_experience):
    """Run A, steps 0 to 15 (tab 1 queues steps 4 to 11 at random); run B (tab 2, lowest confidence
    first), started in the same session after tab 1's page was drawn."""
    other_run = Run.objects.create(name="b", owner=researcher, config=run.config, status=Run.Status.RUNNING)
    for step in range(16):
        make_experience(explorer_step=step, reward=step / 20)
    for step in range(4):
        make_experience(run=other_run, explorer_step=step, reward=0.5)
    tab_1 = annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "random", "step_min": "4",
                                                             "step_max": "11"}, follow=True)
    annotator_client.get(reverse("annotate-start"), {"run": other_run.pk, "strategy": "lowest_confidence"},
                         follow=True)
    assert annotator_client.session["annotate_run"] == other_run.pk  # the session's queue is tab 2's now
    return tab_1


def in_tab_1_queue(item, run) -> bool:
    return item.run_id == run.pk and 4 <= item.explorer_step <= 11


def test_every_form_without_javascript_goes_on_with_its_pages_queue(annotator_client, run, two_queues):
    page, judged = two_queues, []
    for action, data in (("rate", {"point": "4"}), ("flag", {"reason": "garbled"}), ("skip", {}),
                         ("postpone", {}), ("compare", None), ("edit", None)):
        posted = forms(page)
        assert set(posted) >= {"rate", "flag", "skip", "postpone", "edit"}, posted
        item_pk = int(FORM.search(page.content.decode()).group(2))
        for url in posted.values():  # each names this page's queue
            assert f"?run={run.pk}&strategy=random&step_min=4&step_max=11" in url
        if action == "compare":
            other = re.search(r'name="other" value="(\d+)"', page.content.decode())
            if other is None:  # no other response to this prompt is left to compare with
                continue
            data = {"other": other.group(1), "verdict": "a_better"}
        if action == "edit":
            data = {"text": Experience.objects.get(pk=item_pk).task.answer}  # agrees with the reference
        item, page = shown(annotator_client, annotator_client.post(posted[action], {**data, "shown_at": "0"}))
        assert in_tab_1_queue(item, run), (action, item.run.name, item.explorer_step)
        assert f"run={run.pk}&amp;strategy=random" in page.content.decode()
        judged.append(item_pk)
    assert Feedback.objects.filter(experience__run=run).count() + SetAside.objects.count() >= 4


def test_an_edit_asked_to_confirm_comes_back_with_its_queue(annotator_client, run, two_queues):
    edit = forms(two_queues)["edit"]
    asked = annotator_client.post(edit, {"text": "a different answer: 99999", "shown_at": "0"})
    assert asked.status_code == 400 and "Save anyway" in asked.content.decode()
    again = forms(asked)["edit"]
    assert again == edit  # the form asking keeps the page's queue
    item, _ = shown(annotator_client, annotator_client.post(again, {"text": "a different answer: 99999",
                                                                    "confirm": "1", "shown_at": "0"}))
    assert in_tab_1_queue(item, run)


def test_the_next_item_link_of_an_item_not_open_to_judge_keeps_the_queue(annotator_client, run, two_queues,
                                                                           make_annotator):
    judged = Experience.objects.filter(run=run, explorer_step__range=(4, 11)).exclude(
        pk__in=AnnotationLock.objects.values("experience_id")).first()
    services.rate(judged.pk, make_annotator("first"), "4")  # all the judgements it needs
    query = f"run={run.pk}&strategy=random&step_min=4&step_max=11"
    page = annotator_client.get(reverse("annotate-experience", args=[judged.pk]) + "?" + query).content.decode()
    assert "has all the judgements it needs" in page
    assert f'href="/annotate/next/?{query.replace("&", "&amp;")}" id="next"' in page


@pytest.mark.parametrize("query, said", [
    ("run=1&strategy=sideways", "strategy must be one of newest, lowest_confidence, random, ground_truth_first, "
                                "not &#x27;sideways&#x27;"),
    ("run=99999999999999999999999", "run must be a run id, not &#x27;99999999999999999999999&#x27;"),
    ("run=1&strategy=random&reward_min=nan", "reward_min must be a finite number"),
])
def test_a_bad_queue_in_a_forms_address_is_said_and_the_sessions_queue_follows(annotator_client, run, two_queues,
                                                                                 query, said):
    """The judgement is saved (the queue only says where to go next); the JSON refuses the same
    queue with the same words (api.next_item)."""
    query = query.replace("run=1", f"run={run.pk}")
    item_pk = int(FORM.search(two_queues.content.decode()).group(2))
    answer = annotator_client.post(reverse("annotate-rate", args=[item_pk]) + "?" + query, {"point": "4"})
    assert answer.url == reverse("annotate-next")  # the session's queue: tab 2's
    item, page = shown(annotator_client, answer)
    assert item.run.name == "b" and f"Filter not applied: {said}" in page.content.decode()
    assert Feedback.objects.filter(experience_id=item_pk).exists()
    refused = annotator_client.get(reverse("annotate-api-next") + "?" + query)
    assert refused.status_code == 400 and html.unescape(said) in refused.json()["error"]
    # The next page named with it directly says so too, and goes on with the session's queue.
    item, page = shown(annotator_client, annotator_client.get(reverse("annotate-next") + "?" + query))
    assert item.run.name == "b" and f"Filter not applied: {said}" in page.content.decode()
