"""Migrations of the tasksets app, run on real rows."""
import pytest

from tests.support import migrate_to, migrate_to_newest

BEFORE, AFTER = ("tasksets", "0002_taskset_import"), ("tasksets", "0003_tasksetimport_rows_total")


@pytest.mark.django_db(transaction=True)
def test_import_jobs_keep_their_table_and_rows_as_core_jobs():
    """TasksetImport became an apps.core Job: its table only gains rows_total."""
    old = migrate_to(BEFORE).get_model("tasksets", "TasksetImport")
    job = old.objects.create(
        original_filename="t.jsonl", name="t", format="jsonl", status="succeeded", rows_done=7, bytes_total=70
    )
    try:
        new = migrate_to(AFTER).get_model("tasksets", "TasksetImport")
        kept = new.objects.get(pk=job.pk)
        assert (kept.status, kept.rows_done, kept.rows_total, kept.bytes_total) == ("succeeded", 7, 0, 70)
        assert new._meta.db_table == "tasksets_tasksetimport"
    finally:
        migrate_to_newest()
