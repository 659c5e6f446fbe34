"""What a file import fills before anyone sees it: a hidden holder (an expert dataset, a taskset:
ready False, left out of its model's default manager), written a committed batch at a time
(settings.IMPORT_BATCH_ROWS) and shown in one short transaction at the end (apps/buffer/
expert_import.py, apps/tasksets/services.py). A failed or cancelled import deletes it
(`delete_unready`).

An import that dies with its process cannot: `manage.py import_expert_data` killed (kill -9, out
of memory) left its hidden dataset for good, its name refused to every import ("is being
imported") and no page to delete it from; so did an upload job whose own cleanup failed. So who
fills a holder is recorded in the transaction that creates it: an import job (its row points at
the holder: BufferJob.dataset, TasksetImport.taskset), or else this process (apps.core.job_owners,
under the holder's model label and id). A holder whose importer is gone (no active job points at
it, and its process has exited) is a leftover: the next import of its name sets it aside (renamed
SET_ASIDE + its id, which frees the name at once) and queues a task that deletes it on a worker
(apps.core.tasks.delete_leftovers; embedded, a thread), and buffer retention's daily sweep deletes
any left. A live import is never touched: a process of another machine cannot be judged and is
taken as alive (job_owners.is_gone)."""

from collections.abc import Callable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model, QuerySet

from rftweb.celery import enqueue

from . import job_owners
from .models import Job

KINDS: list["HiddenImports"] = []
# A set-aside leftover's name: "~" is no taskset's (a slug), and the id makes it no other holder's.
SET_ASIDE = "~leftover-"


class HiddenImports:
    """The hidden holders of one kind of import: `model` (all_objects, ready), whose rows are the
    `rows` pointing at it through `field`, deleted a batch at a time by `delete_rows(ids)`; its
    import jobs are `jobs`, whose `job_field` points at the holder they fill."""

    def __init__(self, model: type[Model], rows: QuerySet, field: str, delete_rows: Callable[[list[int]], object],
                 jobs: QuerySet, job_field: str):
        self.model, self.rows, self.field, self.delete_rows = model, rows, field, delete_rows
        self.jobs, self.job_field = jobs, job_field
        self.label = model._meta.label_lower  # its importer's record (job_owners): "buffer.expertdataset"
        KINDS.append(self)

    def created(self, holder: Model, job_records: Callable[[Model], None] | None) -> None:
        """Record who fills `holder`, in the transaction that creates it: a job (`job_records(holder)`
        points its row at it), else this process (a command)."""
        if job_records:
            job_records(holder)
        else:
            job_owners.record(self.label, holder.pk)

    def done(self, holder_id: int) -> None:
        """The holder's import is over (it is shown, or deleted), in that transaction: nobody fills it."""
        job_owners.release(self.label, holder_id)

    def importer(self, holder_id: int) -> str | None:
        """Who fills the hidden holder, in words, or None once nobody does (a leftover)."""
        job = self.jobs.filter(status__in=Job.ACTIVE, **{self.job_field: holder_id}).first()
        if job is not None:
            return f"{job._meta.verbose_name} {job.pk}, which its page can cancel"
        owner = job_owners.owner_of(self.label, holder_id)
        if job_owners.is_gone(owner):
            return None
        return f"a command, process {owner.pid} on {owner.host}, until it ends or is stopped"

    def set_aside(self, hidden: QuerySet) -> list[int]:
        """Free the names of the leftovers among `hidden` at once: each renamed SET_ASIDE + its id,
        still hidden, and deleted on a worker once this commits (delete_leftovers below). The next
        import of a name deleted them here, inside its request: a 200,000-row leftover held the
        upload form's name check 62 s on Postgres and 11 s on SQLite (a taskset; an expert
        dataset 100 s and 70 s), on the shared 2-core test machine; set aside, 25 ms and 17 ms
        (12 ms and 20 ms). Returns their ids."""
        gone = [pk for pk in hidden.filter(ready=False).values_list("pk", flat=True) if self.importer(pk) is None]
        for pk in gone:
            self.model.all_objects.filter(pk=pk, ready=False).update(name=f"{SET_ASIDE}{pk}")
        if gone:
            transaction.on_commit(lambda: enqueue("apps.core.tasks.delete_leftovers"))
        return gone

    def delete_leftovers(self, hidden: QuerySet | None = None) -> list[int]:
        """Delete the hidden holders (among `hidden`, by default all) whose importer is gone; returns
        their ids. Nobody takes a leftover up again (a rerun job deletes its own and starts anew)."""
        hidden = (self.model.all_objects if hidden is None else hidden).filter(ready=False)
        gone = [pk for pk in hidden.values_list("pk", flat=True) if self.importer(pk) is None]
        for pk in gone:
            self.delete_unready(pk)
        return gone

    def delete_unready(self, holder_id: int) -> None:
        """Delete the holder `holder_id` if an import is still filling it (ready False), its rows
        IMPORT_BATCH_ROWS at a time, each batch committed: one DELETE of 200k rows would hold the
        write lock as long as their import did. Nothing but its import knows it (no run can name
        it), so nothing else points at its rows."""
        unready = self.rows.filter(**{f"{self.field}_id": holder_id, f"{self.field}__ready": False})
        while ids := list(unready.values_list("pk", flat=True)[:settings.IMPORT_BATCH_ROWS]):
            with transaction.atomic():
                self.delete_rows(ids)
            connection.queries_log.clear()
        with transaction.atomic():
            self.model.all_objects.filter(pk=holder_id, ready=False).delete()
            self.done(holder_id)


def delete_leftovers() -> list[str]:
    """Delete every kind's leftovers (buffer retention's daily sweep); returns them ("buffer.expertdataset 3")."""
    return [f"{kind.label} {pk}" for kind in KINDS for pk in kind.delete_leftovers()]
