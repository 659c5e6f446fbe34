import django.contrib.postgres.indexes
import django.contrib.postgres.search
import django.db.models.functions.text
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """Builds the index without locking out the explorer's writes on a big table. SQLite (the
    embedded default) has no GIN indexes and no full-text search: there the index exists only in
    the migration state, and the admin falls back to a plain substring search."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("buffer", "0002_bufferjob"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="experience",
            index=django.contrib.postgres.indexes.GinIndex(
                django.contrib.postgres.search.SearchVector(
                    django.db.models.functions.text.Left("prompt_text", 100000),
                    django.db.models.functions.text.Left("response_text", 100000),
                    config="simple",
                ),
                name="experience_text_search",
            ),
        ),
    ]
