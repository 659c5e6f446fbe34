"""A big taskset import writes in committed batches (services.import_taskset): embedded SQLite has
one write lock, and one transaction for a 200k-row file held it 20-45 s, so a training run's
writes and an annotator's rating gave up ("database is locked"), the job's progress stayed 0 and
Cancel waited for the end. Each test here has another connection (a thread) write while the
import is under way; the taskset stays hidden until its last batch, and a failed or cancelled
import leaves nothing of it."""

import json
import os
import socket

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.buffer import retention
from apps.core import jobs
from apps.core import tasks as core_tasks
from apps.tasksets import services
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task, Taskset, TasksetImport
from tests.support import (
    command_importing,
    leftovers_queued,
    on_another_connection,
    run_cancelled_after_two_batches,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = [{"q": f"What is {i} + 1?", "a": str(i + 1)} for i in range(50)]
BATCH = 10


@pytest.fixture(autouse=True)
def small_batches(settings, tmp_path):
    settings.IMPORT_BATCH_ROWS = BATCH
    settings.MEDIA_ROOT = tmp_path / "media"


def jsonl(tmp_path, rows):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_others_write_while_a_big_import_runs_and_its_taskset_shows_only_when_complete(tmp_path, researcher):
    seen = []

    def write_and_look():
        Taskset.objects.create(name="written-meanwhile")  # a write, committed at once
        assert services.name_taken("Big") == (
            f"a taskset named 'big' is being imported (a command, process {os.getpid()} on {socket.gethostname()}, "
            "until it ends or is stopped) (names differ only in case)")
        return Taskset.objects.filter(name="big").exists(), Taskset.all_objects.filter(name="big").exists()

    def progress(update):
        if update.rows_done == 2 * BATCH:
            seen.append(on_another_connection(write_and_look))

    taskset = services.import_taskset(jsonl(tmp_path, ROWS), name="big", mapping=FieldMapping("q", "a"),
                                      user=researcher, progress=progress)

    assert seen == [(False, True)], "hidden while its tasks arrive, its name taken"
    assert Taskset.objects.filter(name="written-meanwhile").exists()
    assert Taskset.objects.get(name="big") == taskset and taskset.task_count == len(ROWS)
    assert list(taskset.tasks.values_list("index", flat=True)) == list(range(len(ROWS)))


def test_a_bad_row_after_committed_batches_leaves_no_taskset_and_no_tasks(tmp_path):
    rows = [*ROWS[:35], "{not json", *ROWS[35:]]
    with pytest.raises(services.FileImportError, match="line 36"):
        services.import_taskset(jsonl(tmp_path, rows), name="bad", mapping=FieldMapping("q", "a"))

    assert not Taskset.all_objects.filter(name="bad").exists()
    assert not Task.objects.exists()


def start_import(user, rows=ROWS):
    upload = SimpleUploadedFile("questions.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())
    return services.start_taskset_import(upload=upload, name="uploaded", fmt="jsonl",
                                         mapping=FieldMapping("q", "a"), user=user)


def test_a_running_import_saves_its_progress_per_batch_and_a_cancel_answers_at_once(researcher, monkeypatch):
    job, rows_saved, cancelled, checks = run_cancelled_after_two_batches(
        monkeypatch, "tasksets.tasksetimport", start_import(researcher))

    # Written at most every PROGRESS_INTERVAL_SECONDS: the first batch's at least.
    assert rows_saved >= BATCH and cancelled
    assert job.status == "cancelled" and job.error.startswith("cancelled on request"), job.error
    assert job.taskset is None and TasksetImport.objects.get(pk=job.pk).taskset is None
    assert not Taskset.all_objects.filter(name="uploaded").exists() and not Task.objects.exists()
    assert checks == 3, "it stopped at the check after the cancel"


def test_a_redelivered_import_deletes_its_killed_worker_half_and_starts_again(researcher):
    job = start_import(researcher)
    half = Taskset.all_objects.create(name="uploaded", ready=False)
    Task.objects.bulk_create(Task(taskset=half, index=i, prompt="p") for i in range(BATCH))
    TasksetImport.objects.filter(pk=job.pk).update(status="running", taskset=half)  # its worker was killed

    job = jobs.run_job("tasksets.tasksetimport", job.pk)

    assert job.status == "succeeded", job.error
    taskset = Taskset.objects.get(name="uploaded")
    assert taskset.pk != half.pk and taskset.task_count == len(ROWS) and Task.objects.count() == len(ROWS)


def leftover(name) -> Taskset:
    """A hidden taskset with a batch of tasks, as an import leaves it mid-way."""
    hidden = Taskset.all_objects.create(name=name, ready=False)
    Task.objects.bulk_create(Task(taskset=hidden, index=i, prompt="p") for i in range(BATCH))
    return hidden


def test_a_killed_commands_hidden_taskset_is_deleted_by_the_next_import_of_its_name(tmp_path, monkeypatch):
    # manage.py import_taskset killed (kill -9, out of memory) held its name for good.
    queued = leftovers_queued(monkeypatch)
    hidden = leftover("big")
    with command_importing(hidden) as command:
        with pytest.raises(services.FileImportError, match=rf"is being imported \(a command, process {command.pid} "):
            services.import_taskset(jsonl(tmp_path, ROWS), name="big", mapping=FieldMapping("q", "a"))
        command.kill()
        command.wait()

        taskset = services.import_taskset(jsonl(tmp_path, ROWS), name="big", mapping=FieldMapping("q", "a"))

    assert taskset.task_count == len(ROWS) and Task.objects.filter(taskset=taskset).count() == len(ROWS)
    # Set aside, its name free, hidden, its rows left to a worker: deleted in the name check, a
    # 200,000-row leftover held the upload form's request 62 s on Postgres (hidden_imports.set_aside).
    set_aside = Taskset.all_objects.get(pk=hidden.pk)
    assert (set_aside.name, set_aside.ready, set_aside.tasks.count()) == (f"~leftover-{hidden.pk}", False, BATCH)
    assert list(Taskset.objects.values_list("name", flat=True)) == ["big"]
    assert queued == ["apps.core.tasks.delete_leftovers"]
    assert core_tasks.delete_leftovers() == [f"tasksets.taskset {hidden.pk}"]
    assert not Taskset.all_objects.filter(pk=hidden.pk).exists() and Task.objects.count() == len(ROWS)


def test_the_daily_sweep_deletes_a_finished_jobs_leftover_taskset():
    for status in ("failed", "running"):  # failed: its stop hook could not delete it (the database gone)
        TasksetImport.objects.create(original_filename="t.jsonl", name=status, format="jsonl", status=status,
                                     taskset=leftover(status))

    retention.sweep()  # retention is off: this is all it does

    assert list(Taskset.all_objects.values_list("name", flat=True)) == ["running"]
    assert set(Task.objects.values_list("taskset__name", flat=True)) == {"running"}


def test_the_api_names_an_imports_taskset_only_once_it_is_shown(researcher):
    """A running import's job points at its hidden taskset: the API named it, and
    /api/tasksets/<name>/ answered 404 for it."""
    from apps.runs.api.tasksets import import_json

    hidden = Taskset.all_objects.create(name="coming", ready=False)
    job = TasksetImport.objects.create(name="coming", status="running", taskset=hidden, created_by=researcher)
    assert import_json(job)["taskset"] is None
    Taskset.all_objects.filter(pk=hidden.pk).update(ready=True)
    assert import_json(TasksetImport.objects.get(pk=job.pk))["taskset"] == "coming"
