"""The Workers page's task list (apps/runs/task_log.py): a row a task, its runtime and outcome,
kept for a day and at most KEPT rows (real workers write them: tests/journeys/test_workers_actions.py)."""
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from apps.runs import task_log
from apps.runs.models import TaskRun


def test_a_task_is_listed_running_then_with_its_runtime_outcome_and_result(db, researcher_client):
    task_log.started("t-1", "workers.tasks.serve_duty", (7, "loop"))
    (shown,) = researcher_client.get(reverse("api-workers")).json()["tasks"]
    assert (shown["name"], shown["args"], shown["outcome"], shown["runtime_s"]) == ("serve_duty", "[7, 'loop']",
                                                                                    "running", None)
    task_log.ended("t-1", "SUCCESS", "handed back")
    (shown,) = task_log.recent()
    assert shown["outcome"] == "success" and shown["result"] == "handed back" and shown["runtime_s"] >= 0
    task_log.ended("t-unknown", "SUCCESS", "x")  # a task whose start was not written: nothing to end
    task_log.started("t-2", "workers.tasks.watchdog", None)
    task_log.ended("t-2", "FAILURE", ValueError("x" * 900))
    assert len(TaskRun.objects.get(task_id="t-2").result) == 500  # cut
    assert "Tasks" in researcher_client.get(reverse("worker-list")).content.decode()


def test_the_periodic_tasks_are_summed_up_apart_and_leave_the_list_to_the_rest(db, researcher_client, settings):
    """A walkthrough: after 13 minutes, 34 of the list's 50 rows were the search index's round and
    the watchdog's, and the runs' own tasks had scrolled away."""
    task_log.started("duty", "workers.tasks.serve_duty", (7, "loop"))
    for i in range(60):
        task_log.started(f"index-{i}", "workers.tasks.index_search", None)
        task_log.ended(f"index-{i}", "FAILURE" if i == 3 else "SUCCESS", 0)
    TaskRun.objects.filter(task_id="index-59").update(started_at=timezone.now() + timedelta(seconds=1))
    settings.RFTWEB_EMBEDDED = True  # no beat runs: nothing to sum up
    assert researcher_client.get(reverse("api-workers")).json()["housekeeping"] == []
    settings.RFTWEB_EMBEDDED = False
    answer = researcher_client.get(reverse("api-workers")).json()
    assert [t["task_id"] for t in answer["tasks"]] == ["duty"]
    summed = {row["name"]: row for row in answer["housekeeping"]}
    assert set(summed) == {"alerts", "watchdog", "buffer_retention", "index_search"}
    assert (summed["index_search"]["runs"], summed["index_search"]["failed"]) == (60, 1)
    assert summed["index_search"]["newest"]["task_id"] == "index-59"
    assert (summed["watchdog"]["runs"], summed["watchdog"]["newest"]) == (0, None)
    assert "data-workers-housekeeping" in researcher_client.get(reverse("worker-list")).content.decode()


def test_the_list_keeps_a_day_and_at_most_kept_rows(db, monkeypatch):
    monkeypatch.setattr(task_log, "KEPT", 3)
    now = timezone.now()
    for i in range(6):
        TaskRun.objects.create(task_id=f"t-{i}", name="n", started_at=now - timedelta(minutes=i))
    TaskRun.objects.create(task_id="old", name="n", started_at=now - timedelta(days=2))
    task_log.prune()
    assert sorted(TaskRun.objects.values_list("task_id", flat=True)) == ["t-0", "t-1", "t-2"]
