"""The curation admin: access, the experience list (columns, filters, full-text search, counts,
queries), bulk actions on exactly the selected rows, the detail page, and the jobs' pages."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.buffer import services
from apps.buffer.models import BufferJob, Experience
from apps.core import counts
from apps.core.jobs import run_job
from apps.feedback.models import Feedback

CHANGELIST = "/admin/buffer/experience/"


def listed(response) -> list[int]:
    assert response.status_code == 200, response.content[:500]
    return [experience.pk for experience in response.context["cl"].result_list]


def post_action(client, action, selected=(), *, select_across=False, query="", confirm=False, **options):
    """What the changelist posts for an action (confirm=False), or what its confirmation page posts back."""
    data = {"action": action, "_selected_action": [str(pk) for pk in selected], "select_across": int(select_across)}
    asked = client.post(CHANGELIST + query, {**data, "index": 0})
    if not confirm:
        return asked
    # the confirmation page's own field: the newest row it counted
    through = asked.context["through"] if asked.context else 10**9  # refused (not a curator): no page
    return client.post(CHANGELIST + query, {**data, "confirm": "yes", "through": through, **options})


def job_id(response) -> int:
    """The job an action started, from the job page it redirected to."""
    return int(response["Location"].rstrip("/").split("/")[-2])


# ---- who gets in ----


@pytest.mark.parametrize("who", ["annotator", "researcher"])
def test_only_curators_reach_the_admin(client, who, request, make_experience):
    experience = make_experience()
    job = BufferJob.objects.create(kind=BufferJob.Kind.EXPORT, created_by=request.getfixturevalue("curator"))
    client.force_login(request.getfixturevalue(who))
    for url in [
        CHANGELIST,
        reverse("admin:buffer_experience_change", args=[experience.pk]),
        reverse("admin:buffer_experience_import"),
        reverse("admin:buffer_bufferjob_change", args=[job.pk]),
        reverse("admin:buffer_bufferjob_download", args=[job.pk]),
        "/admin/feedback/feedback/",
        "/admin/runs/run/",
        "/admin/tasksets/task/",
    ]:
        response = client.get(url)
        assert response.status_code == 403 or (
            response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
        ), url
    assert post_action(client, "mark_rejected", [experience.pk], confirm=True).status_code == 302
    experience.refresh_from_db()
    assert experience.status == Experience.Status.READY


def test_a_confirmation_acts_on_the_rows_it_counted_not_those_added_since(curator_client, make_experience):
    """Select all matching, a run writing meanwhile: 8,060 rows were shown and 8,173 deleted."""
    counted = [make_experience(reward=0.0) for _ in range(3)]
    asked = post_action(curator_client, "delete_selection", [counted[0].pk], select_across=True)
    assert asked.context["count"] == 3 and asked.context["through"] == counted[-1].pk
    added = make_experience(reward=0.0)  # the run writes on while the curator reads the page
    data = {"action": "delete_selection", "_selected_action": [str(counted[0].pk)], "select_across": 1,
            "confirm": "yes", "through": asked.context["through"]}
    assert curator_client.post(CHANGELIST, data).status_code == 302
    assert list(Experience.objects.values_list("pk", flat=True)) == [added.pk]
    without = {key: value for key, value in data.items() if key != "through"}  # a page from before, or forged
    assert curator_client.post(CHANGELIST, without).status_code == 302
    assert Experience.objects.filter(pk=added.pk).exists()


def test_anonymous_users_go_to_the_login_page(client, db):
    for url in [
        CHANGELIST,
        reverse("admin:buffer_experience_import"),
        reverse("admin:buffer_bufferjob_download", args=[1]),
    ]:
        response = client.get(url)
        assert response.status_code == 302 and "login" in response["Location"], url


# ---- the list ----


def test_list_shows_the_useful_columns(curator_client, make_experience, annotator):
    experience = make_experience(response_text="x" * 500, source="expert", response_ids=list(range(17)))
    Feedback.objects.create(experience=experience, user=annotator, kind="rating", value=1.0)
    Feedback.objects.create(experience=experience, user=annotator, kind="flag")
    make_experience(run=None)  # imported expert data: no run

    response = curator_client.get(CHANGELIST)

    assert listed(response) == sorted(Experience.objects.values_list("pk", flat=True), reverse=True)
    rows = response.context["cl"].result_list
    assert (rows[1].tokens, rows[1].feedback_count) == (17, 2)
    page = response.content.decode()
    for text in ("expert", "imported", "x" * 79 + "…", "By run", "By reward", "By has feedback", "By flagged"):
        assert text in page, text
    assert "about" not in page.split('class="paginator"')[1]  # a small table is counted exactly


def test_filters(curator_client, make_experience, researcher, annotator):
    from apps.runs.models import Run

    other_run = Run.objects.create(name="other", owner=researcher, config={})
    low = make_experience(reward=0.1)
    high = make_experience(reward=0.9, status=Experience.Status.RAW)
    flagged = make_experience(reward=0.5, run=other_run, source="expert")
    imported = make_experience(run=None, reward=None)
    Feedback.objects.create(experience=flagged, user=annotator, kind="flag")
    Feedback.objects.create(experience=high, user=annotator, kind="rating", value=1.0)

    assert listed(curator_client.get(f"{CHANGELIST}?run__id__exact={other_run.pk}")) == [flagged.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?run__isnull=True")) == [imported.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?source__exact=expert")) == [flagged.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?status__exact=raw")) == [high.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?reward__gte=0.4")) == [flagged.pk, high.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?reward__gte=0.4&reward__lte=0.6")) == [flagged.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?reward__lte=0.2")) == [low.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?has_feedback=yes")) == [flagged.pk, high.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?has_feedback=no")) == [imported.pk, low.pk]
    assert listed(curator_client.get(f"{CHANGELIST}?flagged=yes")) == [flagged.pk]
    assert curator_client.get(f"{CHANGELIST}?reward__gte=lots").status_code == 302  # Django's "?e=1" page


def test_range_filter_keeps_the_other_parameters(curator_client, make_experience):
    make_experience()
    page = curator_client.get(f"{CHANGELIST}?status__exact=ready&q=response&reward__gte=0.5").content.decode()
    form = page.split('class="buffer-range-filter"')[1].split("</form>")[0]
    assert 'name="status__exact" value="ready"' in form and 'name="q" value="response"' in form
    assert 'name="reward__gte" value="0.5"' in form and form.count("reward__gte") == 1


def test_search_is_full_text_over_prompt_and_response(curator_client, make_experience):
    """In both modes: Postgres's full-text search, and its syntax read word by word on SQLite."""
    pie = make_experience(prompt_text="Bake something", response_text="An apple pie, then a cherry pie.")
    tart = make_experience(prompt_text="Bake an apple tart", response_text="Done.")
    make_experience(prompt_text="Unrelated", response_text="pineapple")

    def search(terms):
        return listed(curator_client.get(CHANGELIST, {"q": terms}))

    assert search("apple") == [tart.pk, pie.pk]  # words, not substrings: not "pineapple"
    assert search("apple pie") == [pie.pk]  # every word, across prompt and response
    assert search("bake tart") == [tart.pk]
    assert search('"cherry pie"') == [pie.pk]
    assert search("apple -pie") == [tart.pk]
    assert search("APPLE") == [tart.pk, pie.pk]
    assert search("ppl") == []
    # SQLite searched by substring: "or" matched inside words, "-3" and "+" as text (a review)
    sums = make_experience(prompt_text="What is 3 + 4?", response_text="7")
    assert search("tart or cherry") == [tart.pk, pie.pk]
    assert search("bake tart or cherry") == [tart.pk, pie.pk]  # (bake and tart) or cherry
    assert search("+") == []
    assert search("3 -7") == [] and search("3") == [sums.pk] and search("-3 bake") == [tart.pk, pie.pk]
    assert search('"is 3 4"') == [sums.pk] and search('"apple cherry"') == []
    steps = make_experience(prompt_text="say 4_st", response_text="done")  # "_" parts words, as in Postgres
    assert search("4") == [steps.pk, sums.pk] and search("st") == [steps.pk]


@pytest.mark.postgres("full-text search (a tsvector a row, its GIN index); SQLite searches by substring")
def test_search_uses_the_gin_index(make_experience):
    from django.contrib.postgres.search import SearchQuery

    make_experience()
    query = Experience.objects.filter(search__document=SearchQuery("apple", config="simple", search_type="websearch"))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the planner show its options
        plan = query.explain()
    assert "experience_search_document" in plan


def _matches(word):
    from django.contrib.postgres.search import SearchQuery

    return Experience.objects.filter(search__document=SearchQuery(word, config="simple")).count()


@pytest.mark.postgres("full-text search (a tsvector a row, its GIN index); SQLite searches by substring")
def test_search_document_follows_updates(make_experience):
    """An edit rewrites the document at once, whether or not the indexer had made it yet."""
    from apps.buffer import search

    indexed, pending = make_experience(response_text="before"), make_experience(response_text="early")
    search.catch_up()
    later = make_experience(response_text="late")
    Experience.objects.filter(pk__in=[indexed.pk, later.pk]).update(response_text="after")
    assert (_matches("before"), _matches("after"), _matches("late")) == (0, 2, 0)
    assert search.catch_up() == 0  # the pending range of `later`: its edited document stays
    assert (_matches("after"), _matches("late"), _matches("early")) == (2, 0, 1)
    Experience.objects.filter(pk=pending.pk).update(claimed_at="2026-01-01T00:00:00Z")  # no text: no change
    assert _matches("early") == 1


@pytest.mark.postgres("full-text search (a tsvector a row, its GIN index); SQLite searches by substring")
def test_a_write_is_searchable_after_the_indexer_and_only_then(make_experience):
    from apps.buffer import search

    make_experience(response_text="quince")
    assert _matches("quince") == 0  # the write computed no document
    assert search.backlog() >= 1
    assert search.catch_up() == 0
    assert _matches("quince") == 1
    assert search.backlog() == 0


@pytest.mark.postgres("full-text search (a tsvector a row, its GIN index); SQLite searches by substring")
def test_a_search_catches_up_first_and_says_when_it_could_not(curator_client, make_experience, monkeypatch):
    from apps.buffer import search

    first = make_experience(response_text="medlar")
    assert listed(curator_client.get(CHANGELIST, {"q": "medlar"})) == [first.pk]
    make_experience(response_text="medlar again")
    monkeypatch.setattr(search, "CATCH_UP_SECONDS", 0.0)  # a backlog longer than the budget
    response = curator_client.get(CHANGELIST, {"q": "medlar"})
    assert listed(response) == [first.pk]
    assert "not searchable yet" in response.content.decode()


def test_list_queries_do_not_grow_with_the_rows(curator_client, make_experience, annotator):
    def queries(url):
        curator_client.get(url)  # the session and permissions are warm after this
        with CaptureQueriesContext(connection) as captured:
            assert curator_client.get(url).status_code == 200
        return len(captured)

    url = f"{CHANGELIST}?status__exact=ready&q=response&has_feedback=no"
    make_experience()
    few = queries(url)
    for _ in range(60):
        Feedback.objects.create(experience=make_experience(), user=annotator, kind="rating", value=0.5)
    make_experience()
    # The run and dataset filters list theirs, a query each; one reads the datasets an import is
    # still writing (their rows are left out: expert_import.staged).
    assert queries(url) == few <= 10
    assert queries(CHANGELIST) <= 10


@pytest.mark.postgres("the planner's row estimate; SQLite counts exactly")
def test_a_big_result_is_counted_by_estimate(curator_client, make_experience, monkeypatch):
    monkeypatch.setattr(counts, "EXACT_COUNT_LIMIT", 5)
    for _ in range(8):
        make_experience()
    response = curator_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.paginator.estimated and cl.result_count >= 6
    assert "about" in response.content.decode().split('class="paginator"')[1]
    assert not curator_client.get(f"{CHANGELIST}?q=number+3").context["cl"].paginator.estimated


@pytest.mark.postgres("the planner's row estimate; SQLite counts exactly")
def test_an_estimate_older_than_the_rows_says_more_than_the_limit(curator_client, make_experience, monkeypatch):
    """Statistics taken before a run wrote its rows: the planner expects fewer than were counted
    (the page said "about 10001"); all that is known is that there are more than the limit."""
    from django.db import connection

    monkeypatch.setattr(counts, "EXACT_COUNT_LIMIT", 5)
    make_experience()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE buffer_experience")
    for _ in range(8):
        make_experience()
    response = curator_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.paginator.estimated and cl.paginator.count_prefix == "more than " and cl.result_count == 5
    assert "more than 5 experiences" in response.content.decode().split('class="paginator"')[1]


# ---- bulk actions ----


def test_an_action_asks_for_confirmation_first(curator_client, make_experience):
    rows = [make_experience() for _ in range(3)]
    response = post_action(curator_client, "mark_rejected", [rows[0].pk, rows[2].pk])
    assert response.status_code == 200
    assert response.context["count"] == 2 and "Yes, mark rejected" in response.content.decode()
    assert not Experience.objects.filter(status=Experience.Status.REJECTED).exists()


def test_mark_rejected_and_ready_change_exactly_the_selected_rows(curator_client, make_experience):
    rows = [make_experience() for _ in range(5)]
    chosen = [rows[1].pk, rows[3].pk]

    response = post_action(curator_client, "mark_rejected", chosen, confirm=True)

    assert response.status_code == 302
    assert set(Experience.objects.filter(status="rejected").values_list("pk", flat=True)) == set(chosen)
    post_action(curator_client, "mark_ready", [rows[1].pk], confirm=True)
    assert set(Experience.objects.filter(status="rejected").values_list("pk", flat=True)) == {rows[3].pk}


def test_select_across_acts_on_every_row_the_filters_match(curator_client, make_experience):
    raw_apples = [make_experience(status="raw", response_text=f"apple {i}") for i in range(3)]
    make_experience(status="raw", response_text="pear")
    make_experience(status="ready", response_text="apple")
    query = "?status__exact=raw&q=apple"

    page = post_action(curator_client, "mark_ready", [raw_apples[0].pk], select_across=True, query=query)
    assert page.context["count"] == 3

    post_action(curator_client, "mark_ready", [raw_apples[0].pk], select_across=True, query=query, confirm=True)
    assert set(Experience.objects.filter(status="raw").values_list("response_text", flat=True)) == {"pear"}
    assert Experience.objects.filter(status="ready").count() == 4


def test_set_priority(curator_client, make_experience):
    rows = [make_experience() for _ in range(3)]
    page = post_action(curator_client, "set_priority", [rows[0].pk], confirm=True, priority="lots")
    assert page.status_code == 200 and "Enter a number" in page.content.decode()
    post_action(curator_client, "set_priority", [rows[0].pk, rows[1].pk], confirm=True, priority="2.5")
    assert [row.priority for row in Experience.objects.order_by("pk")] == [2.5, 2.5, 0.0]


def test_delete_removes_the_rows_and_what_depends_on_them_but_keeps_edits(curator_client, make_experience, annotator):
    from django.utils import timezone

    from apps.feedback.models import AnnotationLock

    doomed, kept = make_experience(), make_experience()
    edit = make_experience(source="human_edit", parent=doomed)
    Feedback.objects.create(experience=doomed, user=annotator, kind="rating", value=1.0)
    Feedback.objects.create(experience=kept, user=annotator, kind="preference", other=doomed, value=1.0)
    Feedback.objects.create(experience=kept, user=annotator, kind="rating", value=0.0)
    AnnotationLock.objects.create(experience=doomed, user=annotator, expires_at=timezone.now())

    post_action(curator_client, "delete_selection", [doomed.pk], confirm=True)

    assert set(Experience.objects.values_list("pk", flat=True)) == {kept.pk, edit.pk}
    assert list(Feedback.objects.values_list("kind", flat=True)) == ["rating"]
    assert not AnnotationLock.objects.exists()
    edit.refresh_from_db()
    assert edit.parent_id is None


def test_delete_of_a_feedback_filter_deletes_what_the_filter_matched(curator_client, make_experience, annotator):
    # Deleting the feedback first must not change which rows the "has feedback" filter selected.
    rated = [make_experience() for _ in range(2)]
    unrated = make_experience()
    for experience in rated:
        Feedback.objects.create(experience=experience, user=annotator, kind="rating", value=1.0)
    post_action(
        curator_client, "delete_selection", [rated[0].pk], select_across=True, query="?has_feedback=yes", confirm=True
    )
    assert list(Experience.objects.values_list("pk", flat=True)) == [unrated.pk]


def test_djangos_delete_selected_is_replaced(curator_client):
    actions = curator_client.get(CHANGELIST).context["action_form"].fields["action"].choices
    names = [name for name, _ in actions]
    assert "delete_selected" not in names and "delete_selection" in names


# ---- jobs started by actions (run here directly; the worker path is in test_jobs_worker) ----


def started_job(response) -> BufferJob:
    assert response.status_code == 302, getattr(response, "content", b"")[:500]
    job = BufferJob.objects.get(pk=job_id(response))
    return run_job("buffer.bufferjob", job.pk)


def test_promote_to_expert_copies_exactly_the_selected_rows(curator_client, make_experience):
    rows = [make_experience(advantage=0.5) for _ in range(4)]
    expert = make_experience(source="expert")

    job = started_job(
        post_action(curator_client, "promote_to_expert", [rows[0].pk, rows[2].pk, expert.pk], confirm=True)
    )

    assert (job.status, job.result) == ("succeeded", {"promoted": 2, "skipped": 1})
    copies = Experience.objects.filter(parent__isnull=False).order_by("parent_id")
    assert [copy.parent_id for copy in copies] == [rows[0].pk, rows[2].pk]
    for copy, original in zip(copies, (rows[0], rows[2]), strict=True):
        assert (copy.source, copy.status, copy.run_id, copy.advantage) == ("expert", "ready", original.run_id, None)
        assert (copy.response_ids, copy.reward, copy.group_id) == (
            original.response_ids,
            original.reward,
            f"promoted-{original.group_id}",
        )
    # Promoting again adds nothing.
    again = started_job(post_action(curator_client, "promote_to_expert", [rows[0].pk], confirm=True))
    assert again.result == {"promoted": 0, "skipped": 1}


def test_rescore_with_a_reward_fn(curator_client, make_experience, tasks):
    right = make_experience(task=tasks[2], response_text="The answer is 4.", reward=0.0)
    wrong = make_experience(task=tasks[2], response_text="The answer is 5.", reward=1.0)
    untouched = make_experience(task=tasks[2], response_text="The answer is 5.", reward=1.0)
    no_task = make_experience(task=None, response_text="4", reward=0.3)

    page = post_action(curator_client, "rescore", [right.pk], confirm=True, reward_fn="no_such_fn")
    assert page.status_code == 200 and "unknown reward fn" in page.content.decode()
    job = started_job(
        post_action(
            curator_client, "rescore", [right.pk, wrong.pk, no_task.pk], confirm=True, reward_fn='{"exact_match": 2.0}'
        )
    )

    # The four share a group: its advantages follow the new rewards (tests/apps/buffer/test_rescore.py).
    assert job.result == {"rescored": 2, "skipped_without_task": 1, "advantages_recomputed": 4,
                          "advantages_kept_as_trained": 0, "advantages_stale": 0}
    rewards = dict(Experience.objects.values_list("pk", "reward"))
    assert rewards == {right.pk: 2.0, wrong.pk: 0.0, untouched.pk: 1.0, no_task.pk: 0.3}
    right.refresh_from_db()
    assert right.reward_components == {"exact_match": 1.0}
    assert right.metadata["rescored"] == {
        "reward_fn": {"exact_match": 2.0}, "previous_reward": 0.0, "previous_components": {"exact_match": 1.0},
        "job": job.pk,
    }


def test_pipeline_operator_dedupe_rejects_exact_duplicates_across_the_selection(curator_client, make_experience, tasks):
    # Duplicates of one task, spread over chunk boundaries (chunks are cut between tasks, never inside one).
    first = make_experience(task=tasks[0], response_ids=[7, 7])
    duplicates = [make_experience(task=tasks[0], response_ids=[7, 7]) for _ in range(3)]
    other_task = make_experience(task=tasks[1], response_ids=[7, 7])
    different = make_experience(task=tasks[0], response_ids=[8])
    outside = make_experience(task=tasks[0], response_ids=[7, 7])  # not selected: not compared
    selection = [first.pk, *(d.pk for d in duplicates), other_task.pk, different.pk]

    response = post_action(
        curator_client, "run_pipeline_operator", selection, confirm=True, operator="dedupe", params=""
    )
    job = BufferJob.objects.get(pk=job_id(response))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(services, "CHUNK_ROWS", 2)
        job = run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded", job.error
    rejected = set(Experience.objects.filter(status="rejected").values_list("pk", flat=True))
    assert rejected == {d.pk for d in duplicates}
    assert Experience.objects.get(pk=duplicates[0].pk).metadata["rejected_by"] == "dedupe"
    assert job.result["rejected"] == 3 and job.result["kept"] == 3 and job.result["dedupe/dropped"] == 3
    assert Experience.objects.get(pk=outside.pk).status == "ready"


def test_pipeline_operator_reward_filter_and_shaping(curator_client, make_experience):
    rows = [make_experience(reward=reward, response_ids=[1] * 10) for reward in (0.0, 0.5, 1.0)]
    imported = make_experience(run=None, task=None, response_ids=None, action_mask=None, logprobs=None)
    ids = [row.pk for row in rows]

    job = started_job(
        post_action(
            curator_client,
            "run_pipeline_operator",
            [*ids, imported.pk],
            confirm=True,
            operator="reward_filter",
            params='{"min": 0.4}',
        )
    )
    assert job.result["rejected"] == 1 and job.result["skipped_without_tokens"] == 1
    assert dict(Experience.objects.filter(pk__in=ids).values_list("pk", "status")) == {
        ids[0]: "rejected",
        ids[1]: "ready",
        ids[2]: "ready",
    }

    job = started_job(
        post_action(
            curator_client,
            "run_pipeline_operator",
            ids[1:],
            confirm=True,
            operator="reward_shaping",
            params='{"scale": 2, "length_penalty": 0.01}',
        )
    )
    assert job.result["changed"] == 2
    shaped = Experience.objects.get(pk=ids[2])
    assert shaped.reward == pytest.approx(1.9) and shaped.reward_components["unshaped"] == 1.0
    assert Experience.objects.get(pk=ids[0]).reward == 0.0  # not selected


def test_pipeline_form_checks_operator_and_params(curator_client, make_experience):
    row = make_experience()
    page = post_action(
        curator_client, "run_pipeline_operator", [row.pk], confirm=True, operator="reward_filter", params='{"mni": 1}'
    )
    assert page.status_code == 200
    assert "operator[0].mni: unknown key; did you mean &#x27;min&#x27;?" in page.content.decode()
    page = post_action(curator_client, "run_pipeline_operator", [row.pk], confirm=True, operator="dedupe", params="[1]")
    assert "must be a JSON object" in page.content.decode()
    assert not BufferJob.objects.exists()


def test_a_failing_operator_fails_its_job_and_changes_nothing(curator_client, make_experience):
    rows = [make_experience(reward=1.0), make_experience(reward=None)]
    job = started_job(
        post_action(
            curator_client,
            "run_pipeline_operator",
            [row.pk for row in rows],
            confirm=True,
            operator="reward_shaping",
            params="",
        )
    )
    assert job.status == "failed" and "reward_shaping" in job.error and "NoneType" in job.error
    assert [row.reward for row in Experience.objects.order_by("pk")] == [1.0, None]


def test_job_page_shows_progress_and_result(curator_client, make_experience):
    rows = [make_experience() for _ in range(2)]
    response = post_action(curator_client, "promote_to_expert", [row.pk for row in rows], confirm=True)
    page = curator_client.get(response["Location"])
    pending = page.content.decode()
    snapshot_url = reverse("job-progress", args=["buffer.bufferjob", job_id(response)])
    assert page.status_code == 200 and "job_progress.js" in pending and snapshot_url in pending  # the page follows it
    assert curator_client.get(snapshot_url).json()["status"] == "pending"
    job = run_job("buffer.bufferjob", job_id(response))
    page = curator_client.get(response["Location"]).content.decode()
    assert "succeeded" in page and "promoted: 2" in page and "job_progress.js" not in page
    assert curator_client.get(reverse("admin:buffer_bufferjob_changelist")).status_code == 200
    assert job.percent == 100


# ---- the detail page ----


def test_detail_page(curator_client, make_experience, annotator):
    experience = make_experience(
        messages=[{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi <b>there</b>"}],
        reward_components={"exact_match": 1.0, "format": 0.5},
        metadata={"finish_reason": "stop"},
    )
    sibling = make_experience(group_id=experience.group_id, response_text="the sibling's answer")
    edit = make_experience(source="human_edit", parent=experience, response_text="an edited answer")
    Feedback.objects.create(experience=experience, user=annotator, kind="rating", value=0.75, comment="nice")
    Feedback.objects.create(experience=sibling, user=annotator, kind="preference", other=experience)
    url = reverse("admin:buffer_experience_change", args=[experience.pk])

    page = curator_client.get(url).content.decode()

    assert "Hi &lt;b&gt;there&lt;/b&gt;" in page and "Say hi" in page
    assert "format" in page and "0.5" in page and "finish_reason" in page
    assert "the sibling&#x27;s answer" in page and "an edited answer" in page
    assert "nice" in page and "this one lost" in page
    assert "3 prompt tokens, 3 response tokens" in page and "[-0.5, -0.5, -0.5]" not in page
    with_tokens = curator_client.get(url, {"tokens": "1"}).content.decode()
    assert "[-0.5, -0.5, -0.5]" in with_tokens and str(experience.response_ids) in with_tokens
    assert edit.parent_id == experience.pk


def test_detail_page_saves_only_status_and_priority(curator_client, make_experience):
    experience = make_experience(reward=0.25)
    Experience.objects.filter(pk=experience.pk).update(use_count=7)  # a trainer, meanwhile
    url = reverse("admin:buffer_experience_change", args=[experience.pk])
    response = curator_client.post(url, {"status": "rejected", "priority": "3", "reward": "9"})
    assert response.status_code == 302
    experience.refresh_from_db()
    assert (experience.status, experience.priority, experience.reward, experience.use_count) == (
        "rejected",
        3.0,
        0.25,
        7,
    )


def test_delete_from_the_detail_page(curator_client, make_experience, annotator):
    experience = make_experience()
    edit = make_experience(source="human_edit", parent=experience)
    Feedback.objects.create(experience=experience, user=annotator, kind="flag")
    url = reverse("admin:buffer_experience_delete", args=[experience.pk])
    assert curator_client.get(url).status_code == 200
    curator_client.post(url, {"post": "yes"})
    assert list(Experience.objects.values_list("pk", flat=True)) == [edit.pk] and not Feedback.objects.exists()


# ---- the other admins ----


def test_other_admin_lists_render_with_few_queries(curator_client, make_experience, annotator, tasks):
    from apps.runs.models import Checkpoint

    experience = make_experience()
    Feedback.objects.create(experience=experience, user=annotator, kind="rating", value=1.0)
    Checkpoint.objects.create(run=experience.run, version=1, step=1, path="/tmp/x")
    experience.run.metrics.create(role="trainer", step=1, values={"loss": 1.0})
    for url in [
        "/admin/feedback/feedback/",
        "/admin/runs/run/",
        "/admin/runs/checkpoint/",
        "/admin/runs/metricpoint/",
        "/admin/tasksets/taskset/",
        "/admin/tasksets/task/",
        "/admin/tasksets/tasksetimport/",
        reverse("admin:buffer_bufferjob_changelist"),
    ]:
        curator_client.get(url)
        with CaptureQueriesContext(connection) as captured:
            assert curator_client.get(url).status_code == 200, url
        assert len(captured) <= 8, (url, [q["sql"] for q in captured])


def test_feedback_list_filters_dpo_pairs(curator_client, make_experience, annotator):
    a, b, c = make_experience(), make_experience(), make_experience()
    pair = Feedback.objects.create(experience=a, user=annotator, kind="preference", other=b, value=1.0)
    Feedback.objects.create(experience=b, user=annotator, kind="preference", other=c, value=0.5)  # a tie
    Feedback.objects.create(experience=a, user=annotator, kind="rating", value=1.0)
    response = curator_client.get("/admin/feedback/feedback/?dpo_pair=yes")
    assert [feedback.pk for feedback in response.context["cl"].result_list] == [pair.pk]
