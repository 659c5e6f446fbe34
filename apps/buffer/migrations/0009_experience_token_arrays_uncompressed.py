"""Token ids and logprobs go to TOAST without a compression attempt (issue #29).

A 512-token response's ids and logprobs are 2 KB each, over the row's 2 KB TOAST threshold, so
every row of a write sent both to pglz first. Token ids and float logprobs do not compress
(pg_column_compression was NULL for every row: pglz gave up), so the attempts were wasted work
inside the explorer's COPY: a 128-row write took 11.5 ms, 10.0 with STORAGE EXTERNAL (bench
buffer's batches, median of 40, bench/README). The mask (all ones, mostly) still compresses, and
the texts do. Rows already stored keep their storage; the change is to the catalogue only.
"""
from django.db import migrations

COLUMNS = ("prompt_ids", "response_ids", "logprobs")


def storage(kind):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for column in COLUMNS:
                schema_editor.execute(f"ALTER TABLE buffer_experience ALTER COLUMN {column} SET STORAGE {kind}")

    return run


class Migration(migrations.Migration):
    dependencies = [("buffer", "0008_experience_search_after_the_write")]

    operations = [migrations.RunPython(storage("EXTERNAL"), storage("EXTENDED"), elidable=False)]
