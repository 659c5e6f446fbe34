"""50 annotators at once on one run: nobody judges an item beyond the overlap, and no judgement is lost."""
import threading
import time
from collections import Counter

import pytest
from django.db import connection

from apps.buffer.models import Experience
from apps.feedback import queue, services
from apps.feedback.models import Feedback

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ANNOTATORS = 50
ITEMS = 60
SECONDS = 4.0


@pytest.mark.parametrize("per_item", [1, 2])
def test_fifty_annotators_never_judge_an_item_beyond_the_overlap(
    make_experience, make_annotator, run, settings, per_item
):
    settings.RFTWEB_JUDGEMENTS_PER_ITEM = per_item
    for _ in range(ITEMS):
        make_experience()
    annotators = [make_annotator(f"a{i}") for i in range(ANNOTATORS)]
    saved, errors = Counter(), []
    strategies = list(queue.STRATEGIES)
    deadline = time.monotonic() + SECONDS
    go = threading.Barrier(ANNOTATORS)

    def annotate(user, strategy):
        try:
            go.wait()
            while time.monotonic() < deadline:
                item = queue.next_item(run, user, strategy)
                if item is None:
                    break
                services.rate(item.pk, user, "4")
                saved[item.pk] += 1
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=annotate, args=(u, strategies[i % len(strategies)])) for i, u in enumerate(annotators)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    stored = Counter(Feedback.objects.values_list("experience_id", flat=True))
    assert stored == saved  # every judgement the annotators were told was saved is there
    assert max(stored.values()) <= per_item
    assert sum(stored.values()) == min(ITEMS * per_item, sum(saved.values()))
    assert Feedback.objects.values("experience_id", "user_id").distinct().count() == Feedback.objects.count()
    assert Experience.objects.count() == ITEMS
