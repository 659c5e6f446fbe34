"""An expert-data import writes in committed batches into a hidden dataset (expert_import.py):
embedded SQLite has one write lock, and one transaction for a 200k-row file held it 23.5 s, so a
training run's writes and an annotator's rating gave up ("database is locked"). Here another
connection writes while an import is under way; no page, count, launch or run's copy sees its rows
until the last batch is in; a bad row, a cancel, a deleted target or a redelivered job leaves
nothing behind. On Postgres and on SQLite (`make test-sqlite`)."""

import json
import os
import socket

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.urls import reverse

from apps.buffer import expert_import, retention, services
from apps.buffer.expert_data import DjangoExpertData
from apps.buffer.forms import ExpertDataUploadForm
from apps.buffer.models import BufferJob, Experience, ExpertDataset
from apps.core import jobs
from apps.core import tasks as core_tasks
from apps.core.files import FileImportError
from apps.core.models import JobOwner
from apps.feedback.models import Feedback
from apps.runs.models import Run
from apps.runs.services import validate_config
from tests.support import (
    command_importing,
    leftovers_queued,
    on_another_connection,
    owner_died,
    run_cancelled_after_two_batches,
    taskset_with_a_task,
)
from workers.rft.config import ConfigError, RunConfig

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = [{"prompt": f"What is {i} + 1?", "response": str(i + 1)} for i in range(50)]
PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i)} for i in range(50)]
BATCH = 10


@pytest.fixture(autouse=True)
def small_batches(settings):
    settings.IMPORT_BATCH_ROWS = BATCH


def jsonl(tmp_path, rows, name="expert.jsonl"):
    path = tmp_path / name
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def at_rows(rows_done, act):
    """A progress callback that calls act() once, after the batch that brings the import to rows_done."""
    def progress(rows, bytes_done, bytes_total):
        if rows == rows_done:
            act()
    return progress


def launch_problem(name: str) -> str | None:
    try:
        validate_config({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_dataset": name}})
    except ConfigError as refused:
        return str(refused)
    return None


def run_naming(owner, name: str) -> Run:
    config = RunConfig.from_dict({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"expert_dataset": name},
                                  "trainer": {"total_steps": 4}}).to_dict()
    return Run.objects.create(name="sft", owner=owner, config=config, mode="train", status=Run.Status.RUNNING)


def test_others_write_while_a_big_import_runs_and_its_rows_show_only_when_complete(tmp_path, researcher, curator,
                                                                                       client):
    client.force_login(curator)
    taskset_with_a_task("arithmetic")  # the launch's default taskset
    seen = {}

    def look():
        seen["written"] = on_another_connection(lambda: Experience.objects.create(prompt_text="a rollout").pk)
        seen["dataset"] = ExpertDataset.objects.filter(name="expert").exists()
        datasets = client.get(reverse("admin:buffer_expertdataset_changelist")).content.decode()
        seen["datasets page"] = "0 expert datasets" in datasets
        experiences = client.get(reverse("admin:buffer_experience_changelist")).content.decode()
        seen["experiences page"] = "What is 0 + 1?" in experiences
        seen["launch"] = launch_problem("expert")
        with pytest.raises(ValueError, match="no expert dataset is named 'expert'") as copy:
            DjangoExpertData(run_naming(researcher, "expert").pk, "expert").seed(lambda row: row)
        seen["copy"] = str(copy.value)

    imported = expert_import.import_expert_data(jsonl(tmp_path, ROWS), progress=at_rows(2 * BATCH, look))

    assert seen["written"] and Experience.objects.filter(pk=seen["written"]).exists()
    assert not seen["dataset"] and seen["datasets page"] and not seen["experiences page"]
    assert "no expert dataset named 'expert'" in seen["launch"]
    assert str(imported) == "imported 50 rows into the new dataset 'expert'"
    dataset = ExpertDataset.objects.get(name="expert")
    assert dataset.experiences.count() == len(ROWS) and launch_problem("expert") is None
    assert "What is 0 + 1?" in client.get(reverse("admin:buffer_experience_changelist")).content.decode()


def test_a_dpo_pairs_preference_shows_with_its_rows(tmp_path, curator, client):
    client.force_login(curator)
    seen = {}

    def look():
        seen["feedback page"] = client.get(reverse("admin:feedback_feedback_changelist")).content.decode()
        seen["pairs"] = Feedback.objects.count()
        seen["search"] = client.get(reverse("admin:buffer_experience_changelist"), {"q": "What"}).content.decode()

    expert_import.import_expert_data(jsonl(tmp_path, PAIRS, "pairs.jsonl"), layout="dpo", user=curator,
                                     progress=at_rows(BATCH, look))

    assert seen["pairs"] == BATCH, "stored, batch by batch"
    assert "imported from pairs.jsonl" not in seen["feedback page"]
    assert "What is 0 + 1?" not in seen["search"]
    assert "imported from pairs.jsonl" in client.get(reverse("admin:feedback_feedback_changelist")).content.decode()
    assert expert_import.dataset_size(ExpertDataset.objects.get(name="pairs")) == len(PAIRS)


@pytest.mark.parametrize("layout, rows", [("sft", ROWS), ("dpo", PAIRS)])
def test_a_bad_row_after_committed_batches_leaves_nothing(tmp_path, curator, layout, rows):
    path = jsonl(tmp_path, [*rows[:35], "{not json", *rows[35:]])
    with pytest.raises(FileImportError, match="line 36"):
        expert_import.import_expert_data(path, layout=layout, user=curator)

    assert not ExpertDataset.all_objects.exists()
    assert not Experience.objects.exists() and not Feedback.objects.exists()


def test_a_name_an_import_holds_is_refused_saying_so(tmp_path, curator):
    refusals = []

    def try_the_same_name():
        for append in (False, True):
            with pytest.raises(FileImportError) as refused:
                expert_import.import_expert_data(jsonl(tmp_path, ROWS[:1], "other.jsonl"), dataset="expert",
                                                 append=append)
            refusals.append(refused.value.message)
        form = ExpertDataUploadForm({"layout": "sft", "format": "jsonl", "dataset": "expert", "append": True},
                                    {"file": SimpleUploadedFile("x.jsonl", b"{}\n")})
        refusals.append(form.is_valid() or form.errors["dataset"][0])

    expert_import.import_expert_data(jsonl(tmp_path, ROWS), progress=at_rows(BATCH, try_the_same_name))

    held = (f"the dataset 'expert' is being imported (a command, process {os.getpid()} on {socket.gethostname()}, "
            "until it ends or is stopped): name another one, or add to it once that import has finished")
    assert refusals == [held, held, held[0].upper() + held[1:] + "."]
    assert ExpertDataset.objects.get(name="expert").experiences.count() == len(ROWS)


def test_rows_are_added_to_a_dataset_by_one_import_at_a_time(tmp_path):
    # A run copies a dataset's rows in id order: with two appends at once, the later one shown first
    # and a run started between them, the earlier one's rows (lower ids) were never copied.
    expert_import.import_expert_data(jsonl(tmp_path, ROWS[:3]), dataset="shared")
    refused = []

    def append_again():
        with pytest.raises(FileImportError) as second:
            expert_import.import_expert_data(jsonl(tmp_path, ROWS[:1], "other.jsonl"), dataset="shared", append=True)
        refused.append(second.value.message)
        with pytest.raises(IntegrityError), transaction.atomic():  # what two imports racing past the check meet
            ExpertDataset.all_objects.create(name="shared", layout="sft", ready=False, appends=True)

    expert_import.import_expert_data(jsonl(tmp_path, ROWS), dataset="shared", append=True,
                                     progress=at_rows(BATCH, append_again))

    assert refused == [f"rows are being added to the dataset 'shared' by another import (a command, process "
                       f"{os.getpid()} on {socket.gethostname()}, until it ends or is stopped): add yours once that "
                       "import has finished"]
    assert ExpertDataset.objects.get(name="shared").experiences.count() == 53
    expert_import.import_expert_data(jsonl(tmp_path, ROWS[:1], "other.jsonl"), dataset="shared", append=True)
    assert ExpertDataset.objects.get(name="shared").experiences.count() == 54, "once the first has finished"


def leftover(name, appends=False) -> ExpertDataset:
    """A hidden dataset of `name` with a batch of rows, as an import leaves it mid-way."""
    hidden = ExpertDataset.all_objects.create(name=name, layout="sft", ready=False, appends=appends)
    Experience.objects.bulk_create(Experience(dataset=hidden, source="expert", prompt_text="p") for _ in range(BATCH))
    return hidden


@pytest.mark.parametrize("appends", [False, True])
def test_a_killed_commands_hidden_dataset_is_deleted_by_the_next_import_of_its_name(tmp_path, appends, monkeypatch):
    queued = leftovers_queued(monkeypatch)
    if appends:
        expert_import.import_expert_data(jsonl(tmp_path, ROWS[:3]), dataset="expert")
    hidden = leftover("expert", appends)

    with command_importing(hidden) as command:
        with pytest.raises(FileImportError, match=rf"\(a command, process {command.pid} on "):
            expert_import.import_expert_data(jsonl(tmp_path, ROWS), append=appends)  # it lives: left to it
        assert ExpertDataset.all_objects.filter(pk=hidden.pk).exists()
        command.kill()  # kill -9, out of memory
        command.wait()

        imported = expert_import.import_expert_data(jsonl(tmp_path, ROWS), append=appends)

    assert imported.holds == len(ROWS) + 3 * appends
    # Set aside, its name free, hidden, its rows left to a worker: deleted in the name check, a
    # 200,000-row leftover held the upload form's request 100 s on Postgres (hidden_imports.set_aside).
    set_aside = ExpertDataset.all_objects.get(pk=hidden.pk)
    assert (set_aside.name, set_aside.ready, set_aside.experiences.count()) == (f"~leftover-{hidden.pk}", False, BATCH)
    assert list(ExpertDataset.objects.values_list("name", flat=True)) == ["expert"]
    assert queued == ["apps.core.tasks.delete_leftovers"]
    assert core_tasks.delete_leftovers() == [f"buffer.expertdataset {hidden.pk}"]
    assert not ExpertDataset.all_objects.filter(pk=hidden.pk).exists()
    assert Experience.objects.count() == len(ROWS) + 3 * appends, "its rows went with it"
    assert not JobOwner.objects.exists(), "nor is anyone recorded as importing"


def test_the_daily_sweep_deletes_the_leftovers_of_finished_jobs_and_of_killed_commands(curator):
    failed = leftover("failed-job")  # its job's stop hook could not delete it (the database gone)
    BufferJob.objects.create(kind="import", status="failed", dataset=failed, created_by=curator)
    killed = leftover("killed-command")
    running = leftover("running-job")
    BufferJob.objects.create(kind="import", status="running", dataset=running, created_by=curator)
    live = leftover("live-command")

    with command_importing(killed) as dead, command_importing(live):
        dead.kill()
        dead.wait()
        retention.sweep()  # retention is off: this is all it does

        assert set(ExpertDataset.all_objects.values_list("name", flat=True)) == {"running-job", "live-command"}
    assert set(Experience.objects.values_list("dataset__name", flat=True)) == {"running-job", "live-command"}


@pytest.mark.parametrize("layout, rows", [("sft", ROWS), ("dpo", PAIRS)])
def test_an_append_moves_its_rows_into_the_dataset_at_the_end(tmp_path, curator, layout, rows):
    expert_import.import_expert_data(jsonl(tmp_path, rows[:3]), dataset="shared", layout=layout, user=curator)
    shared = ExpertDataset.objects.get(name="shared")
    sizes = []

    imported = expert_import.import_expert_data(
        jsonl(tmp_path, rows), dataset="shared", append=True, layout=layout, user=curator,
        progress=at_rows(2 * BATCH, lambda: sizes.append(expert_import.dataset_size(shared))),
    )

    assert sizes == [3], "the dataset holds what it held while the import runs"
    unit = {"sft": "rows", "dpo": "pairs"}[layout]
    assert str(imported) == f"added 50 {unit} to the existing dataset 'shared', which now holds 53 {unit}"
    assert expert_import.dataset_size(shared) == 53
    assert list(ExpertDataset.all_objects.values_list("pk", flat=True)) == [shared.pk], "the hidden one is gone"


@pytest.mark.parametrize("remade", [None, "dpo"])
def test_a_dataset_deleted_while_rows_are_added_to_it_fails_the_import_with_nothing_left(tmp_path, curator, remade):
    expert_import.import_expert_data(jsonl(tmp_path, ROWS[:3]), dataset="shared")

    def delete_it():
        on_another_connection(lambda: services.delete_datasets(ExpertDataset.objects.filter(name="shared")))
        if remade:
            ExpertDataset.objects.create(name="shared", layout=remade)

    with pytest.raises(FileImportError) as refused:
        expert_import.import_expert_data(jsonl(tmp_path, ROWS), dataset="shared", append=True,
                                         progress=at_rows(BATCH, delete_it))

    assert refused.value.message == (
        "the dataset 'shared' was deleted while this file was imported, so nothing was added to it"
        + (" (one of that name holds other data now)" if remade else "") + ": import the file again"
    )
    assert not Experience.objects.exists()
    assert list(ExpertDataset.all_objects.values_list("layout", flat=True)) == ([remade] if remade else [])


def start_import(user, rows=ROWS, **params):
    upload = SimpleUploadedFile("expert.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())
    return expert_import.start_import(upload=upload, layout="sft", fmt="jsonl", user=user, **params)


def test_a_cancel_mid_import_leaves_nothing(curator, monkeypatch):
    job, rows_saved, cancelled, checks = run_cancelled_after_two_batches(
        monkeypatch, "buffer.bufferjob", start_import(curator))

    assert rows_saved >= BATCH and cancelled  # written at most every PROGRESS_INTERVAL_SECONDS: the first batch's
    assert job.status == "cancelled" and job.error.startswith("cancelled on request"), job.error
    assert BufferJob.objects.get(pk=job.pk).dataset is None
    assert not ExpertDataset.all_objects.exists() and not Experience.objects.exists()
    assert checks == 3, "it stopped at the check after the cancel"


def test_a_redelivered_import_deletes_its_killed_worker_half_and_starts_again(curator):
    job = start_import(curator)
    half = ExpertDataset.all_objects.create(name="expert", layout="sft", ready=False)
    Experience.objects.bulk_create(Experience(dataset=half, source="expert", prompt_text="p") for _ in range(BATCH))
    BufferJob.objects.filter(pk=job.pk).update(status="running", dataset=half)  # its worker was killed

    job = jobs.run_job("buffer.bufferjob", job.pk)

    assert job.status == "succeeded", job.error
    dataset = ExpertDataset.objects.get(name="expert")
    assert dataset.pk != half.pk and job.dataset == dataset and dataset.experiences.count() == len(ROWS)
    assert Experience.objects.count() == len(ROWS) and ExpertDataset.all_objects.count() == 1


def test_an_import_redelivered_after_its_rows_were_shown_adds_them_once(tmp_path, curator, monkeypatch):
    expert_import.import_expert_data(jsonl(tmp_path, ROWS[:3]), dataset="shared")
    job = start_import(curator, dataset="shared", append=True)
    finish = jobs._finish

    def killed(job, status, **outcome):  # the worker dies once the import has committed
        raise SystemExit
    monkeypatch.setattr(jobs, "_finish", killed)
    with pytest.raises(SystemExit):
        jobs.run_job("buffer.bufferjob", job.pk)
    monkeypatch.setattr(jobs, "_finish", finish)
    owner_died(job)

    job = jobs.run_job("buffer.bufferjob", job.pk)  # redelivered: it was left running

    assert job.status == "succeeded", job.error
    assert job.result == {"rows": 50, "dataset": "shared", "appended": True, "holds": 53}
    assert ExpertDataset.objects.get(name="shared").experiences.count() == 53


@pytest.fixture
def failing_show():
    """The database refuses to delete a hidden dataset while an import job holds a result (in
    _show's transaction, after committing() wrote it): a real failure there, as SQLite's "database
    is locked" at COMMIT was, which rolls the result back."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("""
                CREATE FUNCTION fail_show() RETURNS trigger AS $$ BEGIN
                    IF EXISTS (SELECT 1 FROM buffer_bufferjob WHERE result <> '{}'::jsonb) THEN
                        RAISE EXCEPTION 'disk I/O error';
                    END IF;
                    RETURN OLD;
                END $$ LANGUAGE plpgsql""")
            cursor.execute("CREATE TRIGGER fail_show BEFORE DELETE ON buffer_expertdataset FOR EACH ROW "
                           "EXECUTE FUNCTION fail_show()")
        else:
            cursor.execute("CREATE TRIGGER fail_show BEFORE DELETE ON buffer_expertdataset "
                           "WHEN EXISTS (SELECT 1 FROM buffer_bufferjob WHERE result <> '{}') "
                           "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER fail_show" + (" ON buffer_expertdataset" if connection.vendor == "postgresql"
                                                    else ""))
        if connection.vendor == "postgresql":
            cursor.execute("DROP FUNCTION fail_show()")


def test_an_import_whose_last_transaction_fails_saves_no_result_on_its_job(tmp_path, curator, failing_show):
    expert_import.import_expert_data(jsonl(tmp_path, ROWS[:3]), dataset="shared")
    job = start_import(curator, dataset="shared", append=True)

    with pytest.raises(DatabaseError, match="disk I/O error"):
        jobs.run_job("buffer.bufferjob", job.pk)

    job = BufferJob.objects.get(pk=job.pk)
    assert job.status == "failed" and "disk I/O error" in job.error
    assert job.result == {} and job.dataset is None, "it added nothing, and says so"
    assert ExpertDataset.objects.get(name="shared").experiences.count() == 3
    assert list(ExpertDataset.all_objects.values_list("name", flat=True)) == ["shared"], "the hidden one is gone"
