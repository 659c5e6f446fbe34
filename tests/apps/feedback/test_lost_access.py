"""A person who may no longer annotate lets go of the items they held at once: a review found an
annotator deactivated mid-item kept it taken for RFTWEB_ANNOTATION_LOCK_SECONDS (300 s), while
their websockets closed at once ("experience 1040 is taken by ann1" to the next annotator).
Deactivated, their annotator role taken away, left off the run's annotators: each releases; a
change that leaves them able to annotate releases nothing. On Postgres and SQLite."""
import pytest

from apps.accounts.roles import ANNOTATOR, RESEARCHER
from apps.accounts.services import set_active, set_roles
from apps.feedback import queue, services
from apps.feedback.models import AnnotationLock

pytestmark = pytest.mark.django_db


@pytest.fixture
def held(run, make_experience, make_annotator):
    """ann1 holds the run's only item; ann2 is handed nothing while they do."""
    item = make_experience()
    ann1, ann2 = make_annotator("ann1"), make_annotator("ann2")
    assert queue.next_item(run, ann1) == item
    assert queue.next_item(run, ann2) is None
    return item, ann1, ann2


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_a_deactivated_annotators_item_goes_to_the_next_annotator(run, held, curator, committed):
    item, ann1, ann2 = held
    with committed():
        set_active(ann1, False, by=curator)
    assert not AnnotationLock.objects.filter(user=ann1).exists()
    assert queue.next_item(run, ann2) == item


def test_an_annotator_whose_role_is_taken_away_lets_go_and_one_whose_roles_grow_does_not(run, held, curator,
                                                                                        committed):
    item, ann1, ann2 = held
    with committed():
        set_roles(ann1, [ANNOTATOR, RESEARCHER], by=curator)
    assert AnnotationLock.objects.filter(user=ann1).exists()
    with committed():
        set_roles(ann1, [], by=curator)
    assert queue.next_item(run, ann2) == item


def test_the_groups_cleared_from_the_groups_side_let_go_too(run, held, committed):
    from django.contrib.auth.models import Group

    item, ann1, ann2 = held
    annotators = Group.objects.get(name=ANNOTATOR)
    with committed():
        annotators.user_set.remove(ann2)  # someone else: ann1 keeps the item
    assert AnnotationLock.objects.filter(user=ann1).exists()
    with committed():
        annotators.user_set.clear()
    assert not AnnotationLock.objects.exists()


def test_an_annotator_taken_off_the_run_lets_go_of_its_items_only(run, held, researcher, make_experience,
                                                                  make_annotator):
    from apps.runs.models import Run

    item, ann1, ann2 = held
    other_run = Run.objects.create(name="other", owner=researcher, config={}, status=Run.Status.RUNNING)
    elsewhere = make_experience(run=other_run)
    assert queue.next_item(other_run, ann1) == elsewhere
    services.set_annotators(run, researcher, open_to_all=False, usernames=["ann1", "ann2"])
    assert AnnotationLock.objects.filter(user=ann1).count() == 2  # still assigned: nothing let go
    services.assign_annotator(run, ann1, researcher, assigned=False)
    assert list(AnnotationLock.objects.filter(user=ann1).values_list("experience", flat=True)) == [elsewhere.pk]
    assert queue.next_item(run, ann2) == item
    services.set_annotators(other_run, researcher, open_to_all=False, usernames=["ann2"])
    assert not AnnotationLock.objects.filter(user=ann1).exists()
