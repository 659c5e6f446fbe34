"""What a file import fills before anyone sees it: a hidden holder (an expert dataset, a taskset:
ready False, left out of its model's default manager), written a committed batch at a time
(settings.IMPORT_BATCH_ROWS) and shown in one short transaction at the end (apps/buffer/
expert_import.py, apps/tasksets/services.py). A failed or cancelled import deletes it
(`delete_unready`)."""

from collections.abc import Callable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model, QuerySet


class HiddenImports:
    """The hidden holders of one kind of import: `model` (all_objects, ready), whose rows are the
    `rows` pointing at it through `field`, deleted a batch at a time by `delete_rows(ids)`."""

    def __init__(self, model: type[Model], rows: QuerySet, field: str, delete_rows: Callable[[list[int]], object]):
        self.model, self.rows, self.field, self.delete_rows = model, rows, field, delete_rows

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
        self.model.all_objects.filter(pk=holder_id, ready=False).delete()
