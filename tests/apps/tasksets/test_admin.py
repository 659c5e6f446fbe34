"""Deleting a taskset in the admin: refused while a run may still read it, and the confirmation
counts tasks rather than listing each one (a review found both: a running run failed at its next
step with "max() arg is an empty sequence", and a 90,000-task taskset's page took 20 s)."""
import pytest
from django.urls import reverse

from apps.runs.models import Run
from apps.tasksets.models import Task, Taskset

pytestmark = pytest.mark.django_db


@pytest.fixture
def taskset(curator):
    taskset = Taskset.objects.create(name="math", created_by=curator, task_count=3)
    Task.objects.bulk_create(Task(taskset=taskset, index=i, prompt=f"q{i}", answer=str(i)) for i in range(3))
    return taskset


@pytest.fixture
def curator_client(client, curator):
    client.force_login(curator)
    return client


def run_on(owner, status, **buffer):
    return Run.objects.create(name=f"r-{status}", owner=owner, status=status, config={"buffer": buffer})


def delete_selected(client, taskset, confirm: bool):
    data = {"action": "delete_selected", "_selected_action": [taskset.pk]}
    return client.post(reverse("admin:tasksets_taskset_changelist"), {**data, **({"post": "yes"} if confirm else {})})


@pytest.mark.parametrize("status", [Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.STOPPED, Run.Status.FAILED,
                                    Run.Status.QUEUED])
@pytest.mark.parametrize("key", ["taskset", "eval_taskset", "expert_taskset"])
def test_a_taskset_a_run_may_still_read_is_not_deleted(curator_client, curator, taskset, status, key):
    run = run_on(curator, status, **{key: "math"})
    page = delete_selected(curator_client, taskset, confirm=False).content.decode()
    assert f"run {run.pk} &#x27;r-{status}&#x27; ({status}) reads taskset math" in page
    delete_selected(curator_client, taskset, confirm=True)
    assert Taskset.objects.filter(pk=taskset.pk).exists() and Task.objects.filter(taskset=taskset).count() == 3
    single = curator_client.post(reverse("admin:tasksets_taskset_delete", args=[taskset.pk]), {"post": "yes"})
    assert single.status_code == 200 and Taskset.objects.filter(pk=taskset.pk).exists()


def test_a_taskset_only_completed_runs_named_is_deleted_with_a_count_of_its_tasks(curator_client, curator, taskset):
    run_on(curator, Run.Status.COMPLETED, taskset="math")
    run_on(curator, Run.Status.RUNNING, taskset="other")
    page = delete_selected(curator_client, taskset, confirm=False).content.decode()
    assert "Taskset math, with its 3 tasks" in page and "math#0" not in page  # a line per task before
    assert delete_selected(curator_client, taskset, confirm=True).status_code == 302
    assert not Taskset.objects.exists() and not Task.objects.exists()


def test_the_confirmation_counts_with_thousands_separators(curator_client, taskset):
    Taskset.objects.filter(pk=taskset.pk).update(task_count=90_000)
    page = delete_selected(curator_client, taskset, confirm=False).content.decode()
    assert "Taskset math, with its 90,000 tasks" in page and "Tasks: 90,000" in page


def rename(client, taskset, name):
    form = {"name": name, "description": "", "default_workflow": taskset.default_workflow,
            "default_reward_fn": taskset.default_reward_fn, "source": taskset.source}
    return client.post(reverse("admin:tasksets_taskset_change", args=[taskset.pk]), form)


@pytest.mark.parametrize("status", [Run.Status.STOPPED, Run.Status.RUNNING, Run.Status.FAILED])
def test_a_taskset_a_run_may_still_read_is_not_renamed(curator_client, curator, taskset, status):
    """Runs find their tasksets by name: a rename a review made was accepted, and the stopped run
    it left behind failed at once when resumed ("Taskset matching query does not exist")."""
    run = run_on(curator, status, eval_taskset="math")
    page = rename(curator_client, taskset, "renamed")
    assert page.status_code == 200  # the form again, with the error
    assert (f"run {run.pk} &#x27;r-{status}&#x27; ({status}) reads taskset &#x27;math&#x27; by its name"
            in page.content.decode())
    assert Taskset.objects.get(pk=taskset.pk).name == "math"


def test_a_taskset_no_live_run_reads_is_renamed_and_no_name_is_taken_twice_in_any_case(curator_client, curator,
                                                                                      taskset):
    run_on(curator, Run.Status.COMPLETED, taskset="math")
    Taskset.objects.create(name="Other")
    page = rename(curator_client, taskset, "OTHER")
    assert "a taskset named &#x27;Other&#x27; already exists (names differ only in case)" in page.content.decode()
    assert rename(curator_client, taskset, "Math").status_code == 302  # its own name in another case
    assert Taskset.objects.get(pk=taskset.pk).name == "Math"


def test_a_taskset_being_imported_and_its_tasks_are_not_in_the_admin(curator_client, taskset):
    """Its tasks arrive in committed batches (services.import_taskset): shown, a curator could edit
    or delete tasks of a half import, which a failed import then deletes anyway."""
    half = Taskset.all_objects.create(name="half-imported", ready=False)
    Task.objects.create(taskset=half, index=0, prompt="p", answer="only-in-the-half-import")

    tasksets = curator_client.get(reverse("admin:tasksets_taskset_changelist")).content.decode()
    tasks = curator_client.get(reverse("admin:tasksets_task_changelist")).content.decode()

    assert taskset.name in tasksets and "half-imported" not in tasksets
    assert "only-in-the-half-import" not in tasks
    assert curator_client.get(reverse("admin:tasksets_taskset_change", args=[half.pk])).status_code == 302


# ---- the tasks of a taskset (the Task admin) ----


def delete_tasks(client, tasks, confirm: bool, select_across=False):
    data = {"action": "delete_selected", "_selected_action": [task.pk for task in tasks]}
    if select_across:
        data["select_across"] = "1"
    url = reverse("admin:tasksets_task_changelist")
    return client.post(url, {**data, **({"post": "yes"} if confirm else {})})


@pytest.mark.parametrize("status", [Run.Status.RUNNING, Run.Status.STOPPED, Run.Status.QUEUED])
@pytest.mark.parametrize("key", ["taskset", "eval_taskset"])
def test_the_tasks_of_a_taskset_a_run_may_still_read_are_not_deleted(curator_client, curator, taskset, status, key):
    """The Task admin went around the taskset's own refusal: a held-out set emptied under the demo
    run scored 0.0 at every eval after; a training set's failed the run and every Resume."""
    run = run_on(curator, status, **{key: "math"})
    tasks = list(Task.objects.filter(taskset=taskset))
    page = delete_tasks(curator_client, tasks, confirm=False, select_across=True).content.decode()
    assert f"run {run.pk} &#x27;r-{status}&#x27; ({status}) reads taskset math" in page
    delete_tasks(curator_client, tasks, confirm=True, select_across=True)
    single = curator_client.post(reverse("admin:tasksets_task_delete", args=[tasks[0].pk]), {"post": "yes"})
    assert single.status_code == 200
    assert Task.objects.filter(taskset=taskset).count() == 3


def test_the_tasks_of_a_taskset_no_run_reads_are_deleted_and_counted_again(curator_client, curator, taskset):
    run_on(curator, Run.Status.COMPLETED, taskset="math")
    tasks = list(Task.objects.filter(taskset=taskset).order_by("index"))
    page = delete_tasks(curator_client, tasks[:2], confirm=False).content.decode()
    assert "2 of the 3 tasks of taskset math" in page
    assert delete_tasks(curator_client, tasks[:2], confirm=True).status_code == 302
    assert Taskset.objects.get(pk=taskset.pk).task_count == 1  # it said 3 over 1
    last = curator_client.post(reverse("admin:tasksets_task_delete", args=[tasks[2].pk]), {"post": "yes"})
    assert last.status_code == 302
    assert Taskset.objects.get(pk=taskset.pk).task_count == 0 and not Task.objects.exists()
