"""The annotation pages: who may use them, the queue's flow, and clear errors that save nothing."""
import pytest
from django.urls import reverse

from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.feedback.models import AnnotationLock, Feedback
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


def start(client, run, strategy="newest"):
    return client.get(reverse("annotate-start"), {"run": run.pk, "strategy": strategy})


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("annotate-start"))
    assert response.status_code == 302 and "/accounts/login/" in response.url


def test_an_annotator_rates_one_item_after_another(annotator_client, run, make_experience):
    older, newer = make_experience(explorer_step=0), make_experience(explorer_step=1)
    mine = f"?run={run.pk}&strategy=newest"  # every address of the flow names its queue
    assert start(annotator_client, run).url == reverse("annotate-next") + mine
    response = annotator_client.get(reverse("annotate-next"))
    assert response.url == reverse("annotate-experience", args=[newer.pk]) + mine
    page = annotator_client.get(response.url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "response number 1" in html and "<kbd>Enter</kbd>" in html and "js/annotate.js" in html
    response = annotator_client.post(reverse("annotate-rate", args=[newer.pk]), {"point": "4", "shown_at": "0"})
    assert response.url == reverse("annotate-next")  # a form posted without its page's queue: the session's
    assert annotator_client.get(reverse("annotate-next")).url == reverse("annotate-experience", args=[older.pk]) + mine
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
    from apps.feedback import queue

    experience = make_experience()
    queue.next_item(experience.run, make_annotator("other"))
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
    # The edit has no answer the reference (0) would accept: the form asks once, then saves.
    asked = annotator_client.post(reverse("annotate-edit", args=[a.pk]), {"text": "a better answer"})
    assert asked.status_code == 400 and not Experience.objects.filter(parent=a).exists()
    html = asked.content.decode()
    assert "The reference answer is 0; your edit&#x27;s answer differs. Save anyway?" in html
    assert '<input type="hidden" name="confirm" value="1">' in html and "a better answer</textarea>" in html
    annotator_client.post(reverse("annotate-edit", args=[a.pk]), {"text": "a better answer", "confirm": "1"})
    assert Feedback.objects.get(kind="preference").other_id == b.pk
    assert Experience.objects.get(parent=a).response_text == "a better answer"
    annotator_client.get(reverse("annotate-experience", args=[b.pk]))
    annotator_client.post(reverse("annotate-skip", args=[b.pk]))
    assert not AnnotationLock.objects.exists()


def test_a_multi_turn_item_shows_its_turns_as_the_response(annotator_client, make_experience):
    messages = [
        {"role": "user", "content": "Go left."}, {"role": "assistant", "content": "I went left."},
        {"role": "user", "content": "You see a door."}, {"role": "assistant", "content": "I open it."},
    ]
    experience = make_experience(messages=messages, response_text="I went left.<eos>You see a door.<eos>I open it.")
    page = annotator_client.get(reverse("annotate-experience", args=[experience.pk])).content.decode()
    assert page.count("Go left.") == 1 and page.count("I open it.") == 2 and 'class="trajectory"' in page
    # Besides the turns, the raw response is only the editor's starting text, hidden until the annotator edits.
    assert page.count("I went left.&lt;eos&gt;You see a door.") == 1 and 'id="edit-form" hidden' in page


def test_the_item_shows_its_context_once(annotator_client, make_experience, run, tasks):
    run.config = {"feedback": {"rubric": "Correct and short wins."}}
    run.save()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": tasks[2].prompt},
                {"role": "assistant", "content": "response number 0"}]
    experience = make_experience(task=tasks[2], messages=messages, prompt_text=f"<s>user {tasks[2].prompt}")
    html = annotator_client.get(reverse("annotate-experience", args=[experience.pk])).content.decode()
    # The conversation's turns, not the template's text.
    assert html.count(tasks[2].prompt) == 1 and "<s>user" not in html
    assert "Be brief." in html
    # The response once on show; the editor holds a copy but is hidden until the annotator edits.
    assert html.count("response number 0") == 2 and '<form method="post" action="/annotate/experience/' in html
    assert 'id="edit-form" hidden' in html
    assert 'id="answer">4<' in html and "Reference answer" in html
    assert 'id="rubric">Correct and short wins.<' in html
    for point, label in [("1", "wrong"), ("3", "partly right"), ("5", "perfect")]:
        assert f'data-key="{point}"><kbd>{point}</kbd><small>{label}</small>' in html
    tasks[2].answer = ""
    tasks[2].save()
    html = annotator_client.get(reverse("annotate-experience", args=[experience.pk])).content.decode()
    assert "Reference answer" not in html


def test_an_item_that_can_no_longer_be_judged_offers_no_judgements(annotator_client, make_experience, run):
    experience = make_experience(status="consumed")
    run.status = Run.Status.FAILED
    run.save()
    html = annotator_client.get(reverse("annotate-experience", args=[experience.pk])).content.decode()
    assert "already trained on and its run is failed" in html and 'id="next"' in html
    assert 'data-panel="rate"' not in html and "annotate-rate" not in html and 'id="skip"' not in html


def test_a_finished_runs_empty_queue_says_why_and_waits_for_nothing(annotator_client, make_experience, run):
    make_experience(status="consumed")
    run.status = Run.Status.FAILED
    run.save()
    start(annotator_client, run)
    html = annotator_client.get(reverse("annotate-next")).content.decode()
    assert "has failed: it writes no more experiences" in html
    assert "1 trained on before the run failed: no longer open to judge" in html
    assert "data-socket" not in html and 'id="live"' not in html


def test_the_start_page_says_what_each_run_has_left_to_judge(annotator_client, make_experience, run, researcher):
    make_experience()
    finished = Run.objects.create(name="done", owner=researcher, config={}, status=Run.Status.COMPLETED)
    make_experience(run=finished, status="consumed")
    html = annotator_client.get(reverse("annotate-start")).content.decode()
    assert f'<option value="{run.pk}">{isolate("r")} (running · 1 to judge so far)</option>' in html
    done = isolate("done")
    assert f'<option value="{finished.pk}" disabled>{done} (completed · nothing left to judge)</option>' in html


@pytest.mark.slow  # imports transformers
def test_showing_an_item_starts_loading_the_runs_tokenizer_for_the_first_edit(annotator_client, make_experience, run):
    from apps.feedback import edit_rows

    run.config = {"model": {"path": "tiny"}}
    run.save()
    edit_rows._loaded_tokenizer.cache_clear()
    edit_rows._tokenizers_asked.clear()
    experience = make_experience()
    annotator_client.get(reverse("annotate-experience", args=[experience.pk]))
    assert edit_rows._tokenizers_asked == {"tiny"}  # loading on a thread of its own
    # An edit at once waits for the load under way (two threads importing transformers at once fail).
    response = annotator_client.post(reverse("annotate-edit", args=[experience.pk]), {"text": "The answer is 0."})
    assert response.status_code == 302
    assert edit_rows._loaded_tokenizer.cache_info().currsize == 1
    assert Experience.objects.get(parent=experience).response_ids[-1] == edit_rows._tokenizer("tiny").eos_token_id
