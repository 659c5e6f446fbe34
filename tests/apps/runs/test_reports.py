"""Reports and the compare page's samples panel (issue #44, item 3): what each run wrote for one
task at one step, side by side (the nearest step where a run did not roll it out then); a comparison
saved with a name and a note, opened by its link by every researcher, changed only by its owner or a
curator. On Postgres and SQLite."""
import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.runs import samples, sweeps
from apps.runs.forms import ReportForm
from apps.runs.models import Report, Run
from apps.tasksets.models import Task, Taskset


@pytest.fixture
def tasks(db):
    taskset = Taskset.objects.create(name="sums", task_count=3)
    return [Task.objects.create(taskset=taskset, index=i, prompt=f"{i} + 1?", answer=str(i + 1)) for i in range(3)]


def rolled_out(run, task, step, *responses):
    for index, text in enumerate(responses):
        Experience.objects.create(run=run, task=task, explorer_step=step, rollout_index=index, group_id=f"{step}",
                                  prompt_text=task.prompt, response_text=text, reward=float(text == task.answer),
                                  model_version=step)


@pytest.fixture
def compared(make_run, tasks):
    a, b, c = make_run("lr 1e-3"), make_run("lr 1e-2"), make_run("never")
    rolled_out(a, tasks[0], 4, "1", "2")
    rolled_out(a, tasks[1], 4, "9")
    rolled_out(b, tasks[0], 2, "3")
    rolled_out(b, tasks[0], 6, "1")  # 2 and 6 are as near to 4: the earlier is shown
    rolled_out(b, tasks[1], 7, "2")
    rolled_out(c, tasks[2], 4, "3")
    return a, b, c


def test_each_run_shows_what_it_wrote_at_the_step_or_the_nearest(compared, tasks):
    a, b, c = compared
    shown = samples.columns([a, b, c], tasks[0].pk, 4)
    assert [(col.run, col.step) for col in shown] == [(a, 4), (b, 2), (c, None)]
    assert [r["response_text"] for r in shown[0].rollouts] == ["1", "2"] and shown[0].rollouts[0]["reward"] == 1.0
    assert samples.default_step([a, b]) == 4  # the last step both reached
    assert samples.task_choices([a, b], 4) == [(tasks[0].pk, "0 + 1?"), (tasks[1].pk, "1 + 1?")]
    far = samples.columns([b], tasks[1].pk, 1000)  # beyond every window: still found
    assert far[0].step == 7


def test_the_compare_page_shows_the_samples_side_by_side(researcher_client, compared, tasks):
    a, b, _ = compared
    page = researcher_client.get(reverse("run-compare"), {"runs": [a.pk, b.pk], "task": tasks[0].pk, "step": 4})
    text = page.content.decode()
    assert [col.step for col in page.context["sample_columns"]] == [4, 2]
    assert "step 2 (the nearest with this task)" in text and "<pre>3</pre>" in text
    assert page.context["report_form"]["sample_task"].value() == tasks[0].pk


def test_a_report_saves_the_comparison_and_every_researcher_opens_it(researcher_client, researcher, compared, tasks,
                                                                     annotator):
    a, b, _ = compared
    saved = researcher_client.post(reverse("report-save"), {
        "runs": f"{b.pk},{a.pk}", "name": "lr: 1e-2 learns faster", "note": "see the samples at step 4",
        "chart_filter": "reward", "sample_task": tasks[0].pk, "sample_step": 4})
    report = Report.objects.get()
    assert saved.status_code == 302 and saved.url == reverse("report-detail", args=[report.pk])
    assert (report.run_ids, report.owner, report.chart_filter, report.sample_step) == ([b.pk, a.pk], researcher,
                                                                                     "reward", 4)
    client, annotator_client = Client(), Client()  # the `client` fixture is researcher_client's
    client.force_login(create_user("other", "pw-for-tests-123", roles=(RESEARCHER,)))
    annotator_client.force_login(annotator)
    page = client.get(saved.url)
    text = page.content.decode()
    assert [run.pk for run in page.context["picked_runs"]] == [b.pk, a.pk]
    assert 'data-chart-filter value="reward"' in text and "see the samples at step 4" in text
    assert [col.step for col in page.context["sample_columns"]] == [2, 4]
    assert "Rename, re-note or delete" not in text  # not theirs
    assert client.post(reverse("report-edit", args=[report.pk]), {"name": "mine", "version": 0}).status_code == 403
    assert annotator_client.get(saved.url).status_code == 403
    listed = client.get(reverse("report-list")).content.decode()
    assert "lr: 1e-2 learns faster" in listed


def test_a_report_keeps_the_charts_smoothing_and_the_samples_form_the_charts_view(researcher_client, compared, tasks):
    """Save report kept the filter only as the server had it (?filter=), and the Samples panel's
    Show dropped the smoothing: the page's fields now carry the toolbar's settings (chart_toolbar.js
    keeps them in step with what is typed)."""
    a, b, _ = compared
    page = researcher_client.get(reverse("run-compare"), {"runs": [a.pk, b.pk], "filter": "kl", "smoothing": "0.9",
                                                          "log": "1", "x": "wall"}).content.decode()
    samples_form = page[page.index('id="compare-samples"'):page.index("</form>", page.index('id="compare-samples"'))]
    for field in ('name="filter" value="kl"', 'name="smoothing" value="0.9"', 'name="log" value="1"',
                  'name="x" value="wall"'):
        assert field in samples_form
    save_form = page[page.index('id="save-report"'):]
    assert 'name="chart_filter" value="kl"' in save_form and 'name="chart_smoothing" value="0.9"' in save_form
    researcher_client.post(reverse("report-save"), {"runs": f"{a.pk},{b.pk}", "name": "smoothed", "chart_filter": "kl",
                                                    "chart_smoothing": "0.9"})
    report = Report.objects.get()
    assert (report.chart_filter, report.chart_smoothing) == ("kl", 0.9)
    opened = researcher_client.get(reverse("report-detail", args=[report.pk])).content.decode()
    assert 'data-chart-filter value="kl"' in opened and 'step="0.01" value="0.90"> <output>0.90</output>' in opened
    assert "&filter=kl&smoothing=0.9" in opened  # its link back to Compare
    # A renamed report keeps them; a smoothing out of range is refused.
    researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "renamed", "version": 0})
    report.refresh_from_db()
    assert (report.name, report.chart_filter, report.chart_smoothing) == ("renamed", "kl", 0.9)
    refused = researcher_client.post(reverse("report-save"), {"runs": str(a.pk), "name": "x", "chart_smoothing": "2"})
    assert refused.status_code == 400 and Report.objects.count() == 1


def test_an_edit_that_does_not_say_which_version_it_edits_is_refused_keeping_what_was_typed(researcher_client,
                                                                                            compared):
    """As the run's notes: what such a post would replace is unknown (it read as changed since)."""
    a, b, _ = compared
    report = Report.objects.create(name="r", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    refused = researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "renamed", "note": "mine"})
    report.refresh_from_db()
    assert refused.status_code == 400 and (report.name, report.note) == ("r", "")
    page = refused.content.decode()
    assert "the form did not say which version of it you edit" in page and ">mine</textarea>" in page


def test_a_delete_from_a_page_opened_before_anothers_edit_is_refused(researcher_client, compared, curator):
    a, b, _ = compared
    report = Report.objects.create(name="r", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    other = Client()
    other.force_login(curator)
    other.post(reverse("report-edit", args=[report.pk]), {"name": "curated", "note": "keep me", "version": 0})
    refused = researcher_client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 0})
    assert refused.status_code == 409 and Report.objects.filter(pk=report.pk).exists()
    [said] = shown_messages(refused)
    assert said.startswith("Report not deleted: it was changed by") and "Delete again if it should go" in said
    researcher_client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 1})
    assert not Report.objects.exists()


def test_an_edit_committed_while_a_delete_is_checked_is_not_deleted(researcher_client, compared, monkeypatch):
    """The delete checked the version, then deleted whatever the row held by then."""
    from django.db.models import F

    from apps.runs import views_reports

    a, b, _ = compared
    report = Report.objects.create(name="r", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    real = views_reports.may_edit

    def may_edit_then_a_curator_saves(user, checked):  # their Save commits just after this request read the report
        Report.objects.filter(pk=checked.pk).update(name="curated", note="keep me", version=F("version") + 1)
        return real(user, checked)

    monkeypatch.setattr(views_reports, "may_edit", may_edit_then_a_curator_saves)
    refused = researcher_client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 0})
    assert refused.status_code == 409
    assert Report.objects.get(pk=report.pk).note == "keep me"
    assert shown_messages(refused)[0].startswith("Report not deleted: it was changed by")


def test_a_delete_of_a_report_another_tab_deleted_meanwhile_says_so(researcher_client, compared, monkeypatch):
    """Two Deletes at once: the second found no row and answered a 500 (Report.DoesNotExist)."""
    from apps.runs import views_reports

    a, b, _ = compared
    report = Report.objects.create(name="r", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    real = views_reports.may_edit

    def may_edit_then_another_tab_deletes(user, checked):
        Report.objects.filter(pk=checked.pk).delete()
        return real(user, checked)

    monkeypatch.setattr(views_reports, "may_edit", may_edit_then_another_tab_deletes)
    response = researcher_client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 0})
    assert response.status_code == 302 and response.url == reverse("report-list")
    listed = researcher_client.get(response.url)
    assert shown_messages(listed) == ["Report \u2068r\u2069 was already deleted (its runs stay)."]  # isolated
    assert Run.objects.filter(pk__in=[a.pk, b.pk]).count() == 2


def test_its_owner_renames_it_and_a_curator_deletes_it_keeping_its_runs(researcher_client, curator, compared):
    a, b, _ = compared
    report = Report.objects.create(name="r", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "renamed", "note": "n", "version": 0})
    report.refresh_from_db()
    assert (report.name, report.note, report.run_ids) == ("renamed", "n", [a.pk, b.pk])
    too_long = researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "x", "note": "y" * 10_001,
                                                                            "version": 1})
    report.refresh_from_db()
    assert too_long.status_code == 400 and report.note == "n"
    client = Client()
    client.force_login(curator)
    client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 1})
    assert not Report.objects.exists() and Run.objects.filter(pk__in=[a.pk, b.pk]).count() == 2


def shown_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.mark.parametrize(("field", "typed", "problem"), [
    ("note", "n" * 10_001, "note: at most 10,000 characters"),
    ("name", "n" * 201, "name: Ensure this value has at most 200 characters (it has 201)"),
    ("chart_smoothing", "much", "chart_smoothing: Enter a number"),
])
def test_a_refused_report_comes_back_with_everything_typed(researcher_client, compared, tasks, field, typed,
                                                           problem):
    """It redirected to Compare, and the name, note, filter and smoothing typed were gone; its
    message ended in two periods ("Enter a number..")."""
    a, b, _ = compared
    sent = {"runs": f"{b.pk},{a.pk}", "name": "lr: 1e-2 learns faster", "note": "see step 4",
            "chart_filter": "reward", "chart_smoothing": "0.9", "sample_task": tasks[0].pk, "sample_step": 4,
            field: typed}
    refused = researcher_client.post(reverse("report-save"), sent)
    assert refused.status_code == 400 and not Report.objects.exists()
    assert shown_messages(refused) == [f"Report not saved: {problem}."]
    form = refused.context["report_form"]
    assert {key: form[key].value() for key in ("runs", "name", "note", "sample_task", "sample_step")} == \
        {key: str(sent[key]) for key in ("runs", "name", "note", "sample_task", "sample_step")}
    assert [run.pk for run in refused.context["picked_runs"]] == [b.pk, a.pk]
    page = refused.content.decode()
    save_form = page[page.index('id="save-report"'):]
    assert escape(sent["note"]) in save_form and f'value="{escape(sent["name"])}"' in save_form
    assert 'name="chart_filter" value="reward"' in save_form
    assert ('name="chart_smoothing" value="0.9"' in save_form) == (field != "chart_smoothing")


def test_a_refused_report_offers_its_runs_that_are_left(researcher_client, compared):
    a, b, _ = compared
    refused = researcher_client.post(reverse("report-save"), {"runs": f"{a.pk},999,{b.pk}", "name": "mine"})
    assert shown_messages(refused) == ["Report not saved: runs: no run with id 999."]
    assert refused.context["report_form"]["runs"].value() == f"{a.pk},{b.pk}"  # the next Save saves them
    gone = researcher_client.post(reverse("report-save"), {"runs": "999", "name": "mine", "note": "typed"})
    assert gone.status_code == 400 and "typed</textarea>" in gone.content.decode()  # no run left, the note kept


def test_a_refused_edit_comes_back_with_what_was_typed(researcher_client, compared):
    a, b, _ = compared
    report = Report.objects.create(name="r", note="n", owner=Run.objects.get(pk=a.pk).owner, run_ids=[a.pk, b.pk])
    refused = researcher_client.post(reverse("report-edit", args=[report.pk]),
                                     {"name": "renamed", "note": "y" * 10_001, "version": 0})
    report.refresh_from_db()
    assert refused.status_code == 400 and (report.name, report.note) == ("r", "n")
    assert shown_messages(refused) == ["Report not saved: note: at most 10,000 characters."]
    page = refused.content.decode()
    assert "<details open>" in page and 'value="renamed"' in page and "y" * 10_001 + "</textarea>" in page
    assert "<h1><bdi>r</bdi></h1>" in page  # the heading is the saved name


@pytest.mark.parametrize(("runs", "problem"), [("", "runs"), ("999", "no run with id 999"),
                                                (",".join(str(i) for i in range(1, 60)), "1 to 50 runs")])
def test_a_report_of_no_runs_or_unknown_ones_is_refused(researcher_client, compared, runs, problem):
    response = researcher_client.post(reverse("report-save"), {"runs": runs, "name": "r"}, follow=True)
    assert not Report.objects.exists() and problem in response.content.decode()


def test_a_whole_sweep_is_saved_and_a_comparison_past_the_limit_says_so_before_a_name_is_typed(researcher_client,
                                                                                              make_run):
    """A 24-run sweep (sweeps allow 32) opened in Compare offered Save, then refused it: "a report
    compares 1 to 20 runs"."""
    sweep = [make_run(f"s{i}", status=Run.Status.COMPLETED).pk for i in range(ReportForm.MAX_RUNS + 2)]
    within = sweep[:sweeps.MAX_RUNS]
    page = researcher_client.get(reverse("run-compare"), {"runs": within}).content.decode()
    assert 'id="report-too-many"' not in page
    saved = researcher_client.post(reverse("report-save"), {"runs": ",".join(map(str, within)), "name": "sweep"})
    assert saved.status_code == 302 and Report.objects.get().run_ids == within
    page = researcher_client.get(reverse("run-compare"), {"runs": sweep}).content.decode()
    assert (f"A report keeps at most {ReportForm.MAX_RUNS} runs, and {len(sweep)} are compared: untick 2 to save one"
            in page)


def test_a_report_whose_run_is_gone_says_so(researcher_client, researcher, compared):
    a, b, _ = compared
    report = Report.objects.create(name="r", owner=researcher, run_ids=[a.pk, b.pk])
    Experience.objects.filter(run=b).delete()
    b.delete()
    page = researcher_client.get(reverse("report-detail", args=[report.pk]))
    assert [run.pk for run in page.context["picked_runs"]] == [a.pk] and page.context["gone"] == [report.run_ids[1]]
    assert f"Run #{report.run_ids[1]} no longer exists" in page.content.decode()
    listed = researcher_client.get(reverse("report-list"))
    assert (listed.context["page"].object_list[0].runs_there, listed.context["page"].object_list[0].runs_gone) == (1, 1)
    assert '<td class="num">1 <span class="muted">(1 deleted)</span></td>' in listed.content.decode()  # was "2"


def deleted(run):
    Experience.objects.filter(run=run).delete()
    run.delete()


def test_a_report_whose_run_was_deleted_is_still_renamed_and_drops_it(researcher_client, researcher, compared):
    """Its edit sent the saved ids back to the form, which refused the deleted one: "Report not
    saved: runs: no run with id 2.", and deleting the report was the only way out."""
    a, b, c = compared
    report = Report.objects.create(name="r", note="n", owner=researcher, run_ids=[a.pk, b.pk, c.pk])
    gone_pk = b.pk
    deleted(b)
    page = researcher_client.get(reverse("report-detail", args=[report.pk])).content.decode()
    assert (f"Run #{gone_pk} no longer exists: deleted since the report was saved, it is left out below "
            "(saving the report drops it).") in page
    saved = researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "renamed", "note": "re-noted",
                                                                                  "version": 0}, follow=True)
    report.refresh_from_db()
    assert saved.status_code == 200 and (report.name, report.note, report.run_ids) == ("renamed", "re-noted",
                                                                                       [a.pk, c.pk])
    assert shown_messages(saved) == [f"Saved report \u2068renamed\u2069: run #{gone_pk} was deleted; the report now "
                                     f"holds runs #{a.pk}, #{c.pk}."]
    assert 'id="report-gone"' not in saved.content.decode()  # nothing of it is gone now


def test_a_report_whose_every_run_was_deleted_says_so_and_keeps_what_it_held(researcher_client, researcher, compared):
    a, b, _ = compared
    report = Report.objects.create(name="r", note="n", owner=researcher, run_ids=[a.pk, b.pk])
    ids = report.run_ids
    deleted(a)
    deleted(b)
    page = researcher_client.get(reverse("report-detail", args=[report.pk])).content.decode()
    assert (f"Every run of this report was deleted (#{ids[0]}, #{ids[1]}): it has nothing left to show. Delete it "
            "below, or open Compare to save a new report.") in page
    assert "Pick two or more runs" not in page and "Nothing to show: every run of this report was deleted." in page
    refused = researcher_client.post(reverse("report-edit", args=[report.pk]), {"name": "renamed", "note": "typed",
                                                                                    "version": 0})
    report.refresh_from_db()
    assert refused.status_code == 400 and (report.name, report.note, report.run_ids) == ("r", "n", ids)
    assert shown_messages(refused) == [f"Report not saved: runs #{ids[0]}, #{ids[1]} were deleted, every run it "
                                       "compared: it has nothing left to show. Delete it, or open Compare to save a "
                                       "new report."]
    text = refused.content.decode()
    assert 'value="renamed"' in text and "typed</textarea>" in text and "<h1><bdi>r</bdi></h1>" in text
    researcher_client.post(reverse("report-edit", args=[report.pk]), {"delete": "1", "version": 0})
    assert not Report.objects.exists()


def test_an_edit_from_a_page_opened_before_anothers_save_is_refused_keeping_both(
        researcher_client, compared, curator, researcher):
    """The owner and a curator open the report; the owner re-notes it, then the curator saves from
    the page it had open: it used to overwrite the owner's name and note without a word."""
    a, b, _ = compared
    report = Report.objects.create(name="r", note="n", owner=researcher, run_ids=[a.pk, b.pk])
    client = Client()
    client.force_login(curator)
    opened = {who: who.get(reverse("report-detail", args=[report.pk])).content.decode().split(
        'name="version" value="', 1)[1].split('"', 1)[0] for who in (researcher_client, client)}
    owners = {"name": "lr sweep", "note": "owner: 1e-2 learns faster", "version": opened[researcher_client]}
    researcher_client.post(reverse("report-edit", args=[report.pk]), owners)
    refused = client.post(reverse("report-edit", args=[report.pk]),
                          {"name": "old", "note": "curator: archived", "version": opened[client]})
    report.refresh_from_db()
    assert refused.status_code == 409 and (report.name, report.note) == ("lr sweep", "owner: 1e-2 learns faster")
    assert shown_messages(refused) == [
        f"Report not saved: it was changed by {isolate(researcher.username)} at {report.updated_at:%Y-%m-%d %H:%M} "
        "UTC since you opened it. Theirs is shown above, yours is in the form: merge them and Save again."]
    text = refused.content.decode()
    assert "owner: 1e-2 learns faster" in text and 'value="old"' in text and "curator: archived</textarea>" in text
    merged = text.split('name="version" value="', 1)[1].split('"', 1)[0]  # the owner's: saved again, it is taken
    client.post(reverse("report-edit", args=[report.pk]), {"name": "lr sweep", "note": "both", "version": merged})
    report.refresh_from_db()
    assert (report.note, report.changed_by, report.version) == ("both", curator, 2)
