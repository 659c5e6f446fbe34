"""Data migrations of the buffer, run backwards and forwards on real rows."""
import pytest
from django.db import connection

from apps.runs.models import Run
from tests.support import migrate_to, migrate_to_newest

BEFORE, AFTER = ("buffer", "0004_experience_sample_order"), ("buffer", "0005_experience_arrays_aligned")


@pytest.mark.django_db(transaction=True)
def test_arrays_are_aligned_for_the_engine(researcher):
    old = migrate_to(BEFORE)
    Experience = old.get_model("buffer", "Experience")
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")  # runs stays migrated
    common = {"run_id": run.pk, "prompt_ids": [1], "response_ids": [5, 6, 7]}
    edit = Experience.objects.create(source="human_edit", action_mask=[1, 1, 1], logprobs=[], rollout_index=0, **common)
    imported = Experience.objects.create(source="expert", action_mask=None, rollout_index=1, **common)
    rollout = Experience.objects.create(source="rollout", action_mask=[1, 0, 1], logprobs=[-1.0, -2.0, -3.0],
                                        rollout_index=2, **common)
    try:
        new = migrate_to(AFTER).get_model("buffer", "Experience")
        rows = {row.pk: row for row in new.objects.all()}
        assert rows[edit.pk].logprobs is None
        assert rows[imported.pk].action_mask == [1, 1, 1]
        assert (rows[rollout.pk].action_mask, rows[rollout.pk].logprobs) == ([1, 0, 1], [-1.0, -2.0, -3.0])
    finally:
        migrate_to_newest()


@pytest.mark.django_db(transaction=True)
def test_the_search_document_keeps_its_values_and_follows_edits_both_ways(researcher):
    """0006 turns the generated column into one a trigger fills; back, it is generated again."""
    if connection.vendor != "postgresql":
        pytest.skip("the search document is Postgres's")
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")

    def matches(word):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM buffer_experience WHERE search_document @@ to_tsquery('simple', %s)", [word]
            )
            return cursor.fetchone()[0]

    def edit(pk, text):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE buffer_experience SET response_text = %s WHERE id = %s", [text, pk])

    generated = ("buffer", "0005_experience_arrays_aligned")
    Experience = migrate_to(generated).get_model("buffer", "Experience")
    old = Experience.objects.create(run_id=run.pk, response_text="apples")
    try:
        Experience = migrate_to(("buffer", "0006_experience_claims_stay_hot")).get_model("buffer", "Experience")
        assert matches("apples") == 1  # the stored value stayed
        new = Experience.objects.create(run_id=run.pk, rollout_index=1, prompt_text="pears")
        edit(old.pk, "plums")
        assert (matches("pears"), matches("apples"), matches("plums")) == (1, 0, 1)
        Experience.objects.filter(pk=new.pk).update(claimed_at="2026-01-01T00:00:00Z")  # no text: no change
        assert matches("pears") == 1
        migrate_to(generated)
        assert (matches("pears"), matches("plums")) == (1, 1)
        edit(old.pk, "figs")
        assert (matches("plums"), matches("figs")) == (0, 1)
    finally:
        migrate_to_newest()


@pytest.mark.django_db(transaction=True)
def test_search_documents_move_to_their_table_and_back(researcher):
    """0008 moves the documents out of the row and makes them after the write; back, every row
    has its column again, those the indexer had not reached included."""
    if connection.vendor != "postgresql":
        pytest.skip("the search document is Postgres's")
    from apps.buffer import search

    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")

    def matches(word, where):
        table = "buffer_experience" if where == "row" else "buffer_experiencesearch"
        column = "search_document" if where == "row" else "document"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {column} @@ to_tsquery('simple', %s)", [word])
            return cursor.fetchone()[0]

    before = ("buffer", "0007_bufferjob_retention")
    Experience = migrate_to(before).get_model("buffer", "Experience")
    old = Experience.objects.create(run_id=run.pk, response_text="apples")
    try:
        Experience = migrate_to(("buffer", "0008_experience_search_after_the_write")).get_model("buffer", "Experience")
        assert matches("apples", "table") == 1  # the stored document moved
        Experience.objects.bulk_create([
            Experience(run_id=run.pk, rollout_index=i, prompt_text=f"pear{i}") for i in range(1, 4)
        ])
        assert matches("pear1", "table") == 0
        assert search.catch_up() == 0
        assert [matches(f"pear{i}", "table") for i in range(1, 4)] == [1, 1, 1]
        Experience.objects.create(run_id=run.pk, rollout_index=9, prompt_text="plums")  # not indexed yet
        migrate_to(before)
        assert (matches("apples", "row"), matches("pear2", "row"), matches("plums", "row")) == (1, 1, 1)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE buffer_experience SET response_text = 'figs' WHERE id = %s", [old.pk])
        assert (matches("apples", "row"), matches("figs", "row")) == (0, 1)  # 0006's trigger is back
    finally:
        migrate_to_newest()


@pytest.mark.django_db(transaction=True)
def test_token_arrays_are_stored_without_a_compression_attempt_and_back(researcher):
    """0009: ids and logprobs go out of line uncompressed (EXTERNAL); the mask and texts may still
    compress. Back, all are EXTENDED again."""
    if connection.vendor != "postgresql":
        pytest.skip("TOAST storage is Postgres's")

    def storage():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT attname, attstorage FROM pg_attribute WHERE attrelid = 'buffer_experience'::regclass "
                "AND attname IN ('prompt_ids', 'response_ids', 'action_mask', 'logprobs', 'response_text')"
            )
            return dict(cursor.fetchall())

    expected = {"prompt_ids": "e", "response_ids": "e", "logprobs": "e", "action_mask": "x", "response_text": "x"}
    assert storage() == expected
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")
    from apps.buffer.models import Experience

    row = Experience.objects.create(run=run, response_ids=list(range(4000)), action_mask=[1] * 4000,
                                    logprobs=[-0.5] * 4000)  # logprobs this regular would compress
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_column_compression(response_ids), pg_column_compression(logprobs), "
                       "pg_column_compression(action_mask) FROM buffer_experience WHERE id = %s", [row.pk])
        assert cursor.fetchone() == (None, None, "pglz")
    try:
        migrate_to(("buffer", "0008_experience_search_after_the_write"))
        assert storage() == dict.fromkeys(expected, "x")
    finally:  # back to the newest, as every test after this one expects
        migrate_to_newest()
    assert storage() == expected


@pytest.mark.django_db(transaction=True)
def test_rows_imported_before_datasets_had_names_go_into_two_datasets(researcher):
    """0013: run-less expert rows become the datasets `imported` and `imported-pairs` (a DPO
    import's `pair-…` groups), so a run can name them; a run's own rows stay out of both."""
    Experience = migrate_to(("buffer", "0012_sample_order_priority")).get_model("buffer", "Experience")
    run = Run.objects.create(name="r", owner=researcher, config={}, mode="both")
    sft = Experience.objects.create(source="expert", response_text="4")
    chosen, rejected = (Experience.objects.create(source="expert", group_id="pair-abc-0", rollout_index=i,
                                                  status=status) for i, status in enumerate(("ready", "rejected")))
    own = Experience.objects.create(run_id=run.pk, source="expert", group_id="expert-1")
    try:
        new = migrate_to(("buffer", "0013_expert_dataset"))
        rows = {row.pk: row.dataset.name if row.dataset else None
                for row in new.get_model("buffer", "Experience").objects.select_related("dataset")}
        assert rows == {sft.pk: "imported", chosen.pk: "imported-pairs", rejected.pk: "imported-pairs", own.pk: None}
        layouts = dict(new.get_model("buffer", "ExpertDataset").objects.values_list("name", "layout"))
        assert layouts == {"imported": "sft", "imported-pairs": "dpo"}
    finally:
        migrate_to_newest()


@pytest.mark.django_db(transaction=True)
def test_0016_ends_all_but_the_newest_of_two_imports_adding_to_one_dataset(capsys):
    """0016's constraint (one import at a time per name) failed to be added on a database holding
    two: 'could not create unique index' (Postgres), 'UNIQUE constraint failed' (SQLite)."""
    old = migrate_to(("buffer", "0015_expert_dataset_ready"))
    ExpertDataset, Experience = old.get_model("buffer", "ExpertDataset"), old.get_model("buffer", "Experience")
    BufferJob = old.get_model("buffer", "BufferJob")
    shown = ExpertDataset.objects.create(name="math", layout="sft")
    first = ExpertDataset.objects.create(name="math", layout="sft", ready=False, appends=True)
    second = ExpertDataset.objects.create(name="math", layout="sft", ready=False, appends=True)
    other = ExpertDataset.objects.create(name="code", layout="sft", ready=False)
    for n, dataset in enumerate((shown, first, second, other)):
        Experience.objects.create(source="expert", dataset_id=dataset.pk, rollout_index=n, response_text="r")
    older = BufferJob.objects.create(kind="import", status="running", dataset_id=first.pk)
    newer = BufferJob.objects.create(kind="import", status="running", dataset_id=second.pk)
    try:
        new = migrate_to(("buffer", "0016_expert_dataset_one_import"))
        ExpertDataset, Experience = new.get_model("buffer", "ExpertDataset"), new.get_model("buffer", "Experience")
        BufferJob = new.get_model("buffer", "BufferJob")
        assert sorted(ExpertDataset.objects.values_list("pk", flat=True)) == [shown.pk, second.pk, other.pk]
        assert sorted(Experience.objects.values_list("dataset_id", flat=True)) == sorted(
            [shown.pk, second.pk, other.pk])
        ended = BufferJob.objects.get(pk=older.pk)
        assert ended.status == "failed" and f"import {second.pk} of 'math' was newer" in ended.error
        assert BufferJob.objects.get(pk=newer.pk).status == "running"
        said = f"ended the import of expert dataset 'math' (hidden dataset {first.pk}, 1 rows deleted, job {older.pk})"
        assert said in capsys.readouterr().out
    finally:
        migrate_to_newest()
