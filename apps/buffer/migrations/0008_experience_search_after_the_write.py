"""Full-text search leaves the write (issue #29), and two indexes no query used go.

The trigger of 0006 computed each row's tsvector inside the explorer's COPY: with 800-character
responses of real words, 14.5 of a 128-row batch's 22.9 ms. The documents now live in their own
table (models.ExperienceSearch) and are made after the write:

- a statement trigger on INSERT notes the range of ids the statement wrote (one narrow row a COPY
  or a bulk insert, from its transition table), in buffer_search_pending;
- apps/buffer/search.index_pending turns pending ranges into documents: a beat task, and the
  admin before each search, so a search still finds every committed row;
- a row trigger on an edit of either text rewrites the row's document at once (a curator's edit).

`buffer_search_document` is the one definition of the document, used by both. 'simple' (no
stemming, no stop words) suits code, math and any language; each text is read up to 100,000
characters: a tsvector is capped at 1 MB, and an uncapped one would make a huge text's insert fail.

The other two: the run's own index (experience_sampling and experience_step lead with the run)
and the LIKE index Django adds beside a db_index CharField (group_id is matched exactly).
"""
import django.contrib.postgres.indexes
import django.contrib.postgres.search
import django.db.models.deletion
from django.db import migrations, models

DOCUMENT = (
    "to_tsvector('simple'::regconfig, left({prompt}, 100000) || ' ' || left({response}, 100000))"
)
FORWARD = f"""
CREATE FUNCTION buffer_search_document(prompt text, response text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN {DOCUMENT.format(prompt="prompt", response="response")};

INSERT INTO buffer_experiencesearch (experience_id, document)
    SELECT id, search_document FROM buffer_experience WHERE search_document IS NOT NULL;
DROP TRIGGER experience_search_document ON buffer_experience;
DROP FUNCTION buffer_experience_search_document();
ALTER TABLE buffer_experience DROP COLUMN search_document;  -- and its GIN index

CREATE TABLE buffer_search_pending (id bigserial PRIMARY KEY, first_id bigint NOT NULL, last_id bigint NOT NULL);
CREATE FUNCTION buffer_experience_note_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO buffer_search_pending (first_id, last_id)
        SELECT min(id), max(id) FROM written HAVING count(*) > 0;
    RETURN NULL;
END $$;
CREATE TRIGGER experience_search_pending AFTER INSERT ON buffer_experience
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION buffer_experience_note_pending();

CREATE FUNCTION buffer_experience_search_edited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO buffer_experiencesearch (experience_id, document)
        VALUES (NEW.id, buffer_search_document(NEW.prompt_text, NEW.response_text))
        ON CONFLICT (experience_id) DO UPDATE SET document = EXCLUDED.document;
    RETURN NULL;
END $$;
CREATE TRIGGER experience_search_edited AFTER UPDATE OF prompt_text, response_text ON buffer_experience
    FOR EACH ROW WHEN (OLD.prompt_text IS DISTINCT FROM NEW.prompt_text
                       OR OLD.response_text IS DISTINCT FROM NEW.response_text)
    EXECUTE FUNCTION buffer_experience_search_edited();
"""
BACKWARD = f"""
DROP TRIGGER experience_search_edited ON buffer_experience;
DROP FUNCTION buffer_experience_search_edited();
DROP TRIGGER experience_search_pending ON buffer_experience;
DROP FUNCTION buffer_experience_note_pending();
DROP TABLE buffer_search_pending;

ALTER TABLE buffer_experience ADD COLUMN search_document tsvector;
UPDATE buffer_experience e SET search_document = coalesce(
    (SELECT document FROM buffer_experiencesearch s WHERE s.experience_id = e.id),
    buffer_search_document(e.prompt_text, e.response_text)
);
CREATE INDEX experience_text_search ON buffer_experience USING gin (search_document);
CREATE FUNCTION buffer_experience_search_document() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.search_document := {DOCUMENT.format(prompt="NEW.prompt_text", response="NEW.response_text")};
    RETURN NEW;
END $$;
CREATE TRIGGER experience_search_document BEFORE INSERT OR UPDATE OF prompt_text, response_text
    ON buffer_experience FOR EACH ROW EXECUTE FUNCTION buffer_experience_search_document();
DROP FUNCTION buffer_search_document(text, text);
"""


def on_postgres(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("buffer", "0007_bufferjob_retention")]

    operations = [
        migrations.CreateModel(
            name="ExperienceSearch",
            fields=[
                ("experience", models.OneToOneField(
                    db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                    related_name="search", serialize=False, to="buffer.experience",
                )),
                ("document", django.contrib.postgres.search.SearchVectorField()),
            ],
            options={
                "indexes": [django.contrib.postgres.indexes.GinIndex(
                    fields=["document"], name="experience_search_document"
                )],
            },
        ),
        migrations.RunPython(on_postgres(FORWARD), on_postgres(BACKWARD), elidable=False),
        migrations.AlterField(
            model_name="experience", name="run",
            field=models.ForeignKey(
                blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE,
                related_name="experiences", to="runs.run",
            ),
        ),
        migrations.AlterField(
            model_name="experience", name="group_id", field=models.CharField(blank=True, max_length=100)
        ),
        migrations.AddIndex(model_name="experience", index=models.Index(fields=["group_id"], name="experience_group")),
    ]
