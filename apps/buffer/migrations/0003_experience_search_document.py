from django.db import migrations

# The tsvector the admin's full-text search matches (models.SearchDocument): a generated column,
# so Postgres keeps it current on every insert and update, with a GIN index. 'simple' (no
# stemming, no stop words) suits code, math and any language. Postgres only: SQLite, the embedded
# default, has no full-text search, and the admin searches by substring there.
# (A database migrated while this migration was an expression index of the same name drops that first.)
ADD = """
DROP INDEX IF EXISTS experience_text_search;
ALTER TABLE buffer_experience ADD COLUMN search_document tsvector GENERATED ALWAYS AS (
    to_tsvector('simple'::regconfig, left(prompt_text, 100000) || ' ' || left(response_text, 100000))
) STORED;
CREATE INDEX experience_text_search ON buffer_experience USING gin (search_document);
"""
REMOVE = "ALTER TABLE buffer_experience DROP COLUMN search_document"  # drops its index too


def on_postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("buffer", "0002_bufferjob")]

    operations = [migrations.RunPython(on_postgres(ADD), on_postgres(REMOVE), elidable=False)]
