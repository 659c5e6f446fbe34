"""Narrowing the annotation queue (apps/feedback/queue_filter.py): each filter on its own and with
every strategy, on the start page, the queue's pages and the JSON API; bad values refused naming
the field, nothing applied; annotators with different filters never share an item beyond the run's
judgements per item."""
import re
import threading
from collections import Counter
from urllib.parse import parse_qsl

import pytest
from django.db import connection
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback import queue, services
from apps.feedback.models import AnnotationLock, Feedback
from apps.feedback.queue_filter import FilterError, QueueFilter
from apps.tasksets.models import Task, Taskset

pytestmark = pytest.mark.django_db


def handed(run, user, strategy="newest", **query) -> list[int]:
    """Every item the queue hands the user under the filter, each judged once handed."""
    chosen, items = QueueFilter.from_query(query), []
    while (item := queue.next_item(run, user, strategy, queue_filter=chosen)) is not None:
        items.append(item.pk)
        services.rate(item.pk, user, "4")
    return items


@pytest.mark.parametrize(
    "query, field",
    [
        ({"reward_min": "0.9", "reward_max": "0.1"}, "reward_min (0.9) is above reward_max (0.1)"),
        ({"reward_min": "abc"}, "reward_min must be a number, not 'abc'"),
        ({"reward_max": "nan"}, "reward_max must be a finite number"),
        ({"reward_min": "-inf"}, "reward_min must be a finite number"),
        ({"unscored": "1", "reward_min": "0"}, "unscored: choose unscored items or a reward range"),
        ({"unscored": "maybe"}, "unscored must be on or off"),
        ({"source": "human_edit"}, "source must be one of rollout, synthetic, not 'human_edit'"),
        ({"text": "x" * 201}, "text is 201 characters long; a search has at most 200"),
        ({"step_min": "1.5"}, "step_min must be a whole number of explorer steps"),
        ({"step_min": "5", "step_max": "2"}, "step_min (5) is above step_max (2)"),
        ({"step_max": str(2**40)}, "step_max is past the largest explorer step"),
        ({"task": "difficulty"}, "task must be a task's id or key=value of its metadata"),
    ],
)
def test_bad_values_are_refused_naming_the_field(query, field):
    with pytest.raises(FilterError) as refused:
        QueueFilter.from_query(query)
    assert field in str(refused.value)


def test_a_filter_reads_back_from_its_own_query():
    chosen = QueueFilter.from_query(
        {"reward_min": "0.25", "reward_max": "1", "text": "apple", "task": "level=3", "source": "synthetic",
         "step_min": "2", "step_max": "", "unscored": ""}
    )
    assert chosen.as_query() == {"reward_min": "0.25", "reward_max": "1", "text": "apple", "task": "level=3",
                                 "source": "synthetic", "step_min": "2"}
    assert QueueFilter.from_query(chosen.as_query()) == chosen
    assert chosen.describe() == "reward 0.25 to 1 · step ≥ 2 · synthetic only · task level=3 · text “apple”"
    assert not QueueFilter.from_query({"text": "  "})


@pytest.mark.parametrize(
    "query, expected",
    [
        ({"reward_max": "0.2"}, ["low"]),
        ({"unscored": "1"}, ["unscored"]),
        ({"source": "synthetic"}, ["synthetic"]),
        ({"step_min": "2", "step_max": "3"}, ["unscored", "high"]),
        ({"text": "pineapple"}, ["unscored"]),
        ({"text": "What is 3"}, ["synthetic"]),  # the prompt too: its every word, as the buffer's search reads them
        ({"text": "-pineapple response"}, ["synthetic", "high", "low"]),
        ({"task": "level=hard"}, ["high"]),
        ({"task": "rank=2"}, ["high"]),  # a JSON number matched by its text
    ],
)
@pytest.mark.parametrize("strategy", list(queue.STRATEGIES))
def test_every_filter_combines_with_every_strategy(run, annotator, make_experience, tasks, query, expected, strategy):
    hard = Task.objects.create(taskset=Taskset.objects.create(name="meta"), index=0, prompt="Hard one",
                               metadata={"level": "hard", "rank": 2})
    items = {
        "low": make_experience(reward=0.1, explorer_step=1),
        "high": make_experience(reward=0.9, explorer_step=2, task=hard),
        "unscored": make_experience(reward=None, explorer_step=3, response_text="a pineapple pie"),
        "synthetic": make_experience(reward=0.5, explorer_step=4, source="synthetic", task=tasks[3],
                                     prompt_text="What is 3 + 3?"),
    }
    got = handed(run, annotator, strategy, **query)
    assert sorted(got) == sorted(items[name].pk for name in expected)
    if strategy == "newest":
        assert got == [items[name].pk for name in expected]


def test_a_task_filter_by_id(run, annotator, make_experience, tasks):
    items = [make_experience() for _ in range(4)]  # two a task
    assert sorted(handed(run, annotator, task=str(tasks[1].pk))) == [items[2].pk, items[3].pk]


def test_a_held_item_the_filter_leaves_out_is_not_handed_back(run, annotator, make_experience):
    low, high = make_experience(reward=0.1), make_experience(reward=0.9)
    assert queue.next_item(run, annotator) == high  # held now
    assert queue.next_item(run, annotator, queue_filter=QueueFilter(reward_max=0.5)) == low


# -- the pages -------------------------------------------------------------------------------------


def test_the_start_page_applies_a_filter_and_the_queue_keeps_to_it(annotator_client, run, make_experience):
    items = [make_experience(reward=r / 10, explorer_step=r) for r in range(10)]
    response = annotator_client.get(reverse("annotate-start"),
                                    {"run": run.pk, "strategy": "newest", "reward_min": "0.3", "reward_max": "0.5"})
    mine = f"?run={run.pk}&strategy=newest&reward_min=0.3&reward_max=0.5"
    assert response.url == reverse("annotate-next") + mine
    first = annotator_client.get(response.url).url
    assert first == reverse("annotate-experience", args=[items[5].pk]) + mine
    html = annotator_client.get(first).content.decode()
    assert "3 of 10 left match" in html and "reward 0.3 to 0.5" in html
    share = f"/annotate/?run={run.pk}&amp;strategy=newest&amp;reward_min=0.3&amp;reward_max=0.5"
    assert share in html  # the link that starts this queue for someone else
    annotator_client.post(reverse("annotate-rate", args=[items[5].pk]), {"point": "4", "shown_at": "0"})
    assert annotator_client.get(reverse("annotate-next")).url == reverse("annotate-experience",
                                                                         args=[items[4].pk]) + mine


def test_a_bad_filter_is_refused_naming_the_field_and_the_queue_stays_as_it_was(annotator_client, run, make_experience):
    make_experience(reward=0.9)
    annotator_client.get(reverse("annotate-start"), {"run": run.pk, "source": "synthetic"})
    page = annotator_client.get(reverse("annotate-start"),
                                {"run": run.pk, "strategy": "random", "reward_min": "inf", "source": ""})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Filter not applied: reward_min must be a finite number, not &#x27;inf&#x27;." in html
    assert 'name="reward_min" value="inf"' in html  # the form comes back with what was sent
    session = annotator_client.session
    assert (session["annotate_filter"], session["annotate_strategy"]) == ({"source": "synthetic"}, "newest")


def test_a_filter_that_leaves_nothing_says_so_with_a_link_to_clear_it(annotator_client, run, make_experience):
    item = make_experience(reward=0.9)
    annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest", "unscored": "on"})
    page = annotator_client.get(reverse("annotate-next"))
    html = page.content.decode()
    assert "Nothing left matches your filter" in html
    assert "matches <strong>unscored</strong>;\n  1 is left without it." in html
    clear = f'href="/annotate/?run={run.pk}&amp;strategy=newest" id="filter-clear"'
    assert clear in html
    unfiltered = f"?run={run.pk}&strategy=newest"
    assert annotator_client.get(f"/annotate/?run={run.pk}&strategy=newest").url == reverse("annotate-next") + unfiltered
    item_page = reverse("annotate-experience", args=[item.pk])
    assert annotator_client.get(reverse("annotate-next")).url == item_page + unfiltered


# -- the JSON API ----------------------------------------------------------------------------------


def test_the_api_takes_the_sessions_filter_or_its_own(annotator_client, run, make_experience):
    low, high = make_experience(reward=0.1, explorer_step=1), make_experience(reward=0.9, explorer_step=2)
    annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest", "reward_max": "0.5"})
    data = annotator_client.get(reverse("annotate-api-next")).json()
    assert (data["item"]["id"], data["filter"], data["left"]) == (low.pk, {"reward_max": "0.5"}, "1 of 2 left match")
    data = annotator_client.get(reverse("annotate-api-next"), {"reward_min": "0.5", "exclude": low.pk}).json()
    assert (data["item"]["id"], data["left"]) == (high.pk, "1 of 1 left match")  # low is being judged


def test_an_item_page_goes_on_with_its_own_queue_when_another_tab_starts_another(annotator_client, run,
                                                                                make_experience):
    """Tab A filters to step 3, tab B starts the run unfiltered: A's next items came from B's queue
    (a review saw steps 11 and 10 follow a step-3 filter, the "Filtered:" line gone)."""
    late, early = make_experience(explorer_step=11), make_experience(explorer_step=3)
    page_a = annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest", "step_min": "3",
                                                              "step_max": "3"}, follow=True)
    next_url = re.search(r'data-next-url="([^"]+)"', page_a.content.decode()).group(1).replace("&amp;", "&")
    assert page_a.context["item"] == early
    annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest"})  # tab B
    path, query = next_url.split("?")
    data = annotator_client.get(path, {**dict(parse_qsl(query)), "exclude": str(early.pk)}).json()
    assert (data["item"], data["filter"], data["left"]) == (None, {"step_min": "3", "step_max": "3"},
                                                            "0 of 1 left match")
    data = annotator_client.get(path, dict(parse_qsl(query))).json()
    assert data["item"]["id"] == early.pk and "step 3" in data["item"]["html"]
    b_next = annotator_client.get(reverse("annotate-api-next"), {"exclude": str(early.pk)}).json()
    assert b_next["item"]["id"] == late.pk  # tab B's queue: the session's
    for bad, error in (({"run": "x"}, "run must be a run id"), ({"exclude": "9" * 23}, "exclude must be")):
        response = annotator_client.get(path, {**dict(parse_qsl(query)), **bad})
        assert response.status_code == 400 and response.json()["error"].startswith(error)


def test_the_api_refuses_a_bad_filter_naming_the_field(annotator_client, annotator, run, make_experience):
    make_experience()
    annotator_client.get(reverse("annotate-start"), {"run": run.pk})
    response = annotator_client.get(reverse("annotate-api-next"), {"source": "expert"})
    assert response.status_code == 400
    assert response.json() == {"error": "source must be one of rollout, synthetic, not 'expert'"}
    assert not AnnotationLock.objects.filter(user=annotator).exists()


# -- annotators at once ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("per_item", [1, 2])
def test_annotators_with_different_filters_never_judge_an_item_beyond_the_overlap(
    make_experience, make_annotator, run, settings, per_item
):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = per_item
    for n in range(24):
        make_experience(reward=n / 24, explorer_step=n)
    filters = [QueueFilter(reward_min=0.25), QueueFilter(reward_max=0.75), QueueFilter(step_min=6, step_max=20),
               QueueFilter()]
    annotators = [make_annotator(f"f{i}") for i in range(8)]
    errors, go = [], threading.Barrier(len(annotators))

    def annotate(user, chosen, strategy):
        try:
            go.wait()
            while (item := queue.next_item(run, user, strategy, queue_filter=chosen)) is not None:
                assert Experience.objects.filter(chosen.q(), pk=item.pk).exists()  # what it was handed matches
                services.rate(item.pk, user, "4")
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    strategies = list(queue.STRATEGIES)
    threads = [threading.Thread(target=annotate, args=(u, filters[i % 4], strategies[i % 4]))
               for i, u in enumerate(annotators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    judged = Counter(Feedback.objects.values_list("experience_id", flat=True))
    assert max(judged.values()) <= per_item and len(judged) == 24  # every item judged, none beyond the overlap


def test_a_reloaded_item_page_keeps_its_own_queue(annotator_client, run, make_experience):
    """Tab A filters to step 3; tab B starts the run unfiltered; tab A is reloaded: its page had
    taken the session's queue, B's (the filter gone from its next items and its head)."""
    make_experience(explorer_step=11)
    early = make_experience(explorer_step=3)
    page_a = annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "newest", "step_min": "3",
                                                              "step_max": "3"}, follow=True)
    # annotate.js puts the page's queue (its data-next-url's query) in the address: what a reload asks for.
    next_url = re.search(r'data-next-url="([^"]+)"', page_a.content.decode()).group(1).replace("&amp;", "&")
    address = reverse("annotate-experience", args=[early.pk]) + "?" + next_url.split("?")[1]
    annotator_client.get(reverse("annotate-start"), {"run": run.pk, "strategy": "random"})  # tab B
    reloaded = annotator_client.get(address).content.decode()
    next_url = re.search(r'data-next-url="([^"]+)"', reloaded).group(1).replace("&amp;", "&")
    assert dict(parse_qsl(next_url.split("?")[1])) == {"run": str(run.pk), "strategy": "newest", "step_min": "3",
                                                       "step_max": "3"}
    assert "1 of 2 left match" in reloaded and "step 3" in reloaded
    # Without a queue in its address (a link to the item), the page takes the session's, B's.
    plain = annotator_client.get(reverse("annotate-experience", args=[early.pk])).content.decode()
    assert "strategy=random" in plain and "step_min" not in plain.split('data-next-url="')[1].split('"')[0]
    # A queue in the address that is not the item's run, or not a queue, is the session's; a bad
    # filter is said and not applied.
    other_run = annotator_client.get(reverse("annotate-experience", args=[early.pk]),
                                     {"run": str(run.pk + 1), "strategy": "newest", "step_min": "3"})
    assert "strategy=random" in other_run.content.decode()
    bad = annotator_client.get(reverse("annotate-experience", args=[early.pk]),
                               {"run": str(run.pk), "strategy": "newest", "step_min": "x"}).content.decode()
    assert "Filter not applied: step_min" in bad and "strategy=random" in bad
    odd = annotator_client.get(reverse("annotate-experience", args=[early.pk]),
                               {"run": str(run.pk), "strategy": "sideways"}).content.decode()
    assert "strategy must be one of" in odd and "strategy=random" in odd
