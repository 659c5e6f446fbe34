"""The embedded mode's (SQLite's) buffer search gets an index: an FTS5 table over the experiences'
prompt and response, kept by triggers. The search read every row before, a regex a text
(search.websearch_q): 0.6 s of CPU for a rare word at 2 x 10^5 rows, linear in the buffer.

The table holds only the index (content= the experiences: no second copy of the texts); rowid is
the experience's id. The tokenizer reads words as the regex did: unicode61 parts them at what is
not a letter or a digit ("_" included) and folds case; remove_diacritics 0 keeps "café" apart from
"cafe", as Postgres' 'simple' configuration and the regex do. Rows written before are indexed here
('rebuild'). Postgres has its own index (0008): nothing happens there.

SQLite drops a table's triggers with the table, and Django's SQLite schema editor remakes a table
to alter a column: a later migration that alters buffer_experience on SQLite must create these
triggers again (tests/apps/buffer/test_search_sqlite.py fails until it does).
"""
from django.db import migrations

FORWARD = [
    """CREATE VIRTUAL TABLE buffer_experience_fts USING fts5(
        prompt_text, response_text, content='buffer_experience', content_rowid='id',
        tokenize='unicode61 remove_diacritics 0')""",
    """CREATE TRIGGER buffer_experience_fts_insert AFTER INSERT ON buffer_experience BEGIN
        INSERT INTO buffer_experience_fts (rowid, prompt_text, response_text)
            VALUES (new.id, new.prompt_text, new.response_text);
    END""",
    # An external-content index removes a row by its old values: they must be the ones indexed.
    """CREATE TRIGGER buffer_experience_fts_delete AFTER DELETE ON buffer_experience BEGIN
        INSERT INTO buffer_experience_fts (buffer_experience_fts, rowid, prompt_text, response_text)
            VALUES ('delete', old.id, old.prompt_text, old.response_text);
    END""",
    # Only an edit of a text: a claim or a release of a row (an update of other columns) stays cheap.
    """CREATE TRIGGER buffer_experience_fts_update AFTER UPDATE OF prompt_text, response_text ON buffer_experience
    WHEN old.prompt_text IS NOT new.prompt_text OR old.response_text IS NOT new.response_text BEGIN
        INSERT INTO buffer_experience_fts (buffer_experience_fts, rowid, prompt_text, response_text)
            VALUES ('delete', old.id, old.prompt_text, old.response_text);
        INSERT INTO buffer_experience_fts (rowid, prompt_text, response_text)
            VALUES (new.id, new.prompt_text, new.response_text);
    END""",
    "INSERT INTO buffer_experience_fts (buffer_experience_fts) VALUES ('rebuild')",
]
BACKWARD = [
    "DROP TRIGGER buffer_experience_fts_update",
    "DROP TRIGGER buffer_experience_fts_delete",
    "DROP TRIGGER buffer_experience_fts_insert",
    "DROP TABLE buffer_experience_fts",
]


def on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("buffer", "0013_expert_dataset")]

    operations = [migrations.RunPython(on_sqlite(FORWARD), on_sqlite(BACKWARD), elidable=False)]
