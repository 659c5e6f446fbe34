"""The annotation pages: who may use them, the queue's flow, and clear errors that save nothing."""
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.feedback.models import AnnotationLock, Feedback

pytestmark = pytest.mark.django_db


def start(client, run, strategy="newest"):
    return client.get(reverse("annotate-start"), {"run": run.pk, "strategy": strategy})


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("annotate-start"))
    assert response.status_code == 302 and "/accounts/login/" in response.url


def test_an_annotator_rates_one_item_after_another(annotator_client, run, make_experience):
    older, newer = make_experience(explorer_step=0), make_experience(explorer_step=1)
    assert start(annotator_client, run).url == reverse("annotate-next")
    response = annotator_client.get(reverse("annotate-next"))
    assert response.url == reverse("annotate-experience", args=[newer.pk])
    page = annotator_client.get(response.url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "response number 1" in html and "<kbd>Enter</kbd>" in html and "js/annotate.js" in html
    response = annotator_client.post(reverse("annotate-rate", args=[newer.pk]), {"point": "4", "shown_at": "0"})
    assert response.url == reverse("annotate-next")
    assert annotator_client.get(reverse("annotate-next")).url == reverse("annotate-experience", args=[older.pk])
    rating = Feedback.objects.get()
    assert (rating.experience_id, rating.value, rating.seconds_spent) == (newer.pk, 0.75, 3600.0)


def test_researchers_annotate_too(researcher_client, run, make_experience):
    experience = make_experience()
    response = researcher_client.post(reverse("annotate-flag", args=[experience.pk]), {"reason": "garbled"})
    assert response.status_code == 302
    assert Feedback.objects.get().label == "garbled"


def test_the_empty_queue_waits_for_new_experiences(annotator_client, run):
    start(annotator_client, run)
    page = annotator_client.get(reverse("annotate-next"))
    assert b"Nothing to judge" in page.content and f"/ws/annotate/{run.pk}/".encode() in page.content


@pytest.mark.parametrize(
    "action, data, error",
    [
        ("rate", {"point": "9"}, "not on this run"),
        ("edit", {"text": "   "}, "empty"),
        ("edit", {"text": "x" * 20_001}, "at most 20000"),
        ("compare", {"verdict": "a_better"}, "no other response"),
        ("flag", {"reason": "meh"}, "unknown flag"),
    ],
)
def test_bad_input_shows_a_clear_error_and_saves_nothing(annotator_client, make_experience, action, data, error):
    experience = make_experience()
    response = annotator_client.post(reverse(f"annotate-{action}", args=[experience.pk]), data)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Feedback.objects.exists() and Experience.objects.count() == 1


def test_an_item_taken_by_another_annotator_is_refused(annotator_client, make_experience, make_annotator):
    from apps.feedback import services

    experience = make_experience()
    services.next_item(experience.run, make_annotator("other"))
    page = annotator_client.get(reverse("annotate-experience", args=[experience.pk]))
    assert "taken by other" in page.content.decode()
    response = annotator_client.post(reverse("annotate-rate", args=[experience.pk]), {"point": "5"})
    assert response.status_code == 400 and "taken by other" in response.content.decode()
    assert not Feedback.objects.exists()


def test_edit_compare_skip_from_the_page(annotator_client, make_experience, run):
    a, b = make_experience(), make_experience()
    page = annotator_client.get(reverse("annotate-experience", args=[a.pk]))
    assert f'name="other" value="{b.pk}"' in page.content.decode()
    annotator_client.post(reverse("annotate-compare", args=[a.pk]), {"other": b.pk, "verdict": "a_better"})
    annotator_client.post(reverse("annotate-edit", args=[a.pk]), {"text": "a better answer"})
    assert Feedback.objects.get(kind="preference").other_id == b.pk
    assert Experience.objects.get(parent=a).response_text == "a better answer"
    annotator_client.get(reverse("annotate-experience", args=[b.pk]))
    annotator_client.post(reverse("annotate-skip", args=[b.pk]))
    assert not AnnotationLock.objects.exists()


def test_a_multi_turn_item_shows_its_conversation(annotator_client, make_experience):
    messages = [{"role": "user", "content": "Go left."}, {"role": "assistant", "content": "I went left."}]
    experience = make_experience(messages=messages)
    page = annotator_client.get(reverse("annotate-experience", args=[experience.pk])).content.decode()
    assert "Conversation" in page and "I went left." in page and 'class="trajectory"' in page
