"""Importing expert data (SFT and DPO layouts, JSONL and Parquet): what each row becomes, the
bad-file corpus (a clear error, nothing kept), the import job and the admin's upload page."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.buffer import expert_import
from apps.buffer.models import BufferJob, Experience
from apps.core.files import FileImportError
from apps.core.jobs import run_job
from apps.feedback.models import Feedback

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def write_jsonl(path, rows):
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8"
    )
    return path


def imported() -> list[Experience]:
    return list(Experience.objects.order_by("pk"))


def test_sft_rows_in_each_shape(tmp_path, db):
    path = write_jsonl(
        tmp_path / "sft.jsonl",
        [
            {"prompt": "What is 1 + 1?", "response": "2", "metadata": {"source": "book"}, "ignored": "x"},
            {"prompt": CHAT, "response": "4", "reward": 1, "reward_components": {"exact_match": 1}},
            "   ",  # blank lines are skipped
            {"messages": [*CHAT, {"role": "assistant", "content": "Four."}], "group_id": "g", "rollout_index": 2},
            {
                "prompt": "p",
                "response": "r",
                "prompt_ids": [1, 2],
                "response_ids": [3, 4],
                "action_mask": [1, 0],
                "logprobs": [-0.5, -1],
                "model_version": 4,
                "priority": 2,
            },
        ],
    )

    assert expert_import.import_expert_data(path).rows == 4

    text, chat, messages_only, tokens = imported()
    for row in (text, chat, messages_only, tokens):
        assert (row.source, row.status, row.run_id, row.task_id, row.parent_id) == ("expert", "ready", None, None, None)
    assert (text.prompt_text, text.response_text, text.messages, text.metadata) == (
        "What is 1 + 1?",
        "2",
        None,
        {"source": "book"},
    )
    assert (text.prompt_ids, text.response_ids, text.reward, text.reward_components) == (None, None, None, {})
    assert chat.prompt_text == "Be brief.\n\nWhat is 2 + 2?"
    assert chat.messages == [*CHAT, {"role": "assistant", "content": "4"}]
    assert (chat.reward, chat.reward_components) == (1.0, {"exact_match": 1.0})
    assert (messages_only.prompt_text, messages_only.response_text) == ("Be brief.\n\nWhat is 2 + 2?", "Four.")
    assert (messages_only.group_id, messages_only.rollout_index) == ("g", 2)
    assert (tokens.prompt_ids, tokens.response_ids, tokens.action_mask, tokens.logprobs) == (
        [1, 2],
        [3, 4],
        [1, 0],
        [-0.5, -1.0],
    )
    assert (tokens.model_version, tokens.priority) == (4, 2.0)


def test_sft_parquet_with_chat_structs_and_json_text(tmp_path, db):
    path = tmp_path / "sft.parquet"
    pq.write_table(
        pa.table(
            {
                "messages": [[*CHAT, {"role": "assistant", "content": "4"}], None],
                "prompt": [None, "Name a colour."],
                "response": [None, "red"],
                "response_ids": pa.array([[7, 8], None], pa.list_(pa.int32())),
                "metadata": ['{"k": [1, 2]}', None],
                "unused": [1, 2],
            }
        ),
        path,
    )

    assert expert_import.import_expert_data(path).rows == 2

    chat, text = imported()
    assert (chat.response_text, chat.response_ids, chat.metadata) == ("4", [7, 8], {"k": [1, 2]})
    assert (text.prompt_text, text.response_text, text.messages) == ("Name a colour.", "red", None)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_dpo_rows_become_two_experiences_and_a_preference(tmp_path, curator, suffix):
    rows = [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away.", "metadata": {"batch": 1}},
        {"prompt": CHAT, "chosen": "4", "rejected": "5", "metadata": None},
    ]
    path = tmp_path / f"pairs.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, rows)
    else:
        # A Parquet column has one type: the text prompt goes in as a one-message chat.
        prompts = [[{"role": "user", "content": "Say hi"}], CHAT]
        pq.write_table(
            pa.table(
                {
                    "prompt": prompts,
                    "chosen": [row["chosen"] for row in rows],
                    "rejected": [row["rejected"] for row in rows],
                }
            ),
            path,
        )

    # pairs, as the file counts them
    assert expert_import.import_expert_data(path, layout="dpo", user=curator).rows == 2

    chosen, rejected, chat_chosen, chat_rejected = imported()
    assert (chosen.response_text, chosen.status, rejected.response_text, rejected.status) == (
        "Hi!",
        "ready",
        "Go away.",
        "rejected",
    )
    assert chosen.group_id == rejected.group_id != chat_chosen.group_id
    assert (chosen.rollout_index, rejected.rollout_index) == (0, 1)
    assert rejected.metadata["preference"] == "rejected"
    assert chat_rejected.messages == [*CHAT, {"role": "assistant", "content": "5"}]
    preferences = Feedback.objects.order_by("pk").values_list("experience_id", "other_id", "user_id", "kind", "value")
    assert list(preferences) == [
        (chosen.pk, rejected.pk, curator.pk, "preference", 1.0),
        (chat_chosen.pk, chat_rejected.pk, curator.pk, "preference", 1.0),
    ]


def test_dpo_needs_a_user(tmp_path, db):
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}])
    with pytest.raises(FileImportError, match="needs a user"):
        expert_import.import_expert_data(path, layout="dpo")


BAD_SFT_ROWS = [
    ({"prompt": "p"}, "needs 'prompt' and 'response'"),
    ({"response": "r"}, "needs a 'prompt'"),
    ({"prompt": "", "response": "r"}, "'prompt' is empty"),
    ({"prompt": "p", "response": 4}, "'response' must be text or a list of one assistant turn, got a number"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "'messages' has no assistant turn"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}, "message 1 has no string 'content'"),
    ({"messages": "[not json"}, "'messages' is text but not valid JSON"),
    ({"prompt": "p", "response": "r", "response_ids": [1, 2.5]}, "'response_ids'[1] is 2.5, not a 32-bit integer"),
    ({"prompt": "p", "response": "r", "response_ids": [2**31]}, "not a 32-bit integer"),
    (
        {"prompt": "p", "response": "r", "response_ids": [1], "action_mask": [1, 1]},
        "'action_mask' has 2 entries for 1 response tokens",
    ),
    ({"prompt": "p", "response": "r", "response_ids": [1], "action_mask": [2]}, "a mask holds 0 and 1"),
    ({"prompt": "p", "response": "r", "logprobs": [-1.0]}, "'logprobs' is given without 'response_ids'"),
    ({"prompt": "p", "response": "r", "reward": "high"}, "'reward' must be a number, got a string"),
    ({"prompt": "p", "response": "r", "reward_components": {"a": "x"}}, "'reward_components.a' must be a number"),
    ({"prompt": "p", "response": "r", "metadata": [1]}, "'metadata' must be an object, got an array"),
    ({"prompt": "p", "response": "r", "rollout_index": -1}, "'rollout_index' must be a whole number"),
    ({"prompt": "p", "response": "r", "group_id": "g" * 101}, "over the limit of 100"),
    ({"prompt": "p", "response": "nul \x00 here"}, "NUL character"),
    # A row that teaches nothing: SFT on an empty response learns to stop at once.
    ({"prompt": "p", "response": ""}, "'response' is empty"),
    ({"prompt": "p", "response": " \n"}, "'response' is empty"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
     "the assistant's reply in 'messages' is empty"),
]


@pytest.mark.parametrize("bad_row, message", BAD_SFT_ROWS)
def test_a_bad_row_is_named_and_nothing_is_kept(tmp_path, db, bad_row, message):
    good = {"prompt": "p", "response": "r"}
    path = write_jsonl(tmp_path / "data.jsonl", [good, good, good, bad_row])

    with pytest.raises(FileImportError) as error:
        expert_import.import_expert_data(path, batch_size=2)  # the first two rows are already inserted when it fails

    assert (error.value.file, error.value.line) == ("data.jsonl", 4)
    assert message in error.value.message
    assert not Experience.objects.exists()


@pytest.mark.parametrize(
    "bad_row, message",
    [
        # chosen == rejected: DPO's loss is -log sigmoid(0) = ln 2 whatever the model, its gradient 0.
        ({"prompt": "p", "chosen": "4", "rejected": "4"}, "'chosen' and 'rejected' are the same response"),
        ({"prompt": "p", "chosen": "", "rejected": "4"}, "'chosen' is empty"),
    ],
)
def test_a_dpo_row_that_teaches_nothing_is_named_and_nothing_is_kept(tmp_path, curator, bad_row, message):
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    path = write_jsonl(tmp_path / "pairs.jsonl", [good, good, good, bad_row])
    with pytest.raises(FileImportError) as error:
        expert_import.import_expert_data(path, layout="dpo", user=curator, batch_size=2)
    assert (error.value.file, error.value.line) == ("pairs.jsonl", 4)
    assert message in error.value.message
    assert not Experience.objects.exists() and not Feedback.objects.exists()


@pytest.mark.parametrize(
    "content, name, layout, message",
    [
        (b'{"prompt": "p", "response": "r"}\n{"prompt": \n', "data.jsonl", "sft", "line 2: invalid JSON"),
        (b"[1, 2]\n", "data.jsonl", "sft", "line 1: expected a JSON object, got an array"),
        (b"", "data.jsonl", "sft", "the file has no rows"),
        (b"prompt,response\np,r\n", "data.csv", "sft", "CSV files cannot hold expert data: use .jsonl, .ndjson, "
         ".parquet, .pq$"),
        (b"not parquet", "data.parquet", "sft", "not a readable Parquet file"),
        (b'{"prompt": "p", "chosen": "a"}\n', "pairs.jsonl", "dpo", "line 1: missing 'rejected'"),
        (b'{"prompt": "p", "response": "\xff"}\n', "data.jsonl", "sft", "not valid UTF-8"),
        # Python's "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()" named no field
        (b'{"prompt": "p", "response": "r", "metadata": {"id": ' + b"9" * 5_000 + b"}}\n", "data.jsonl", "sft",
         r"line 1: 'metadata.id' is a whole number of 5,000 digits; at most 4,300 are read \(write it as a string"),
    ],
)
def test_bad_files(tmp_path, curator, content, name, layout, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(FileImportError, match=message):
        expert_import.import_expert_data(path, layout=layout, user=curator)
    assert not Experience.objects.exists() and not Feedback.objects.exists()


def test_a_bad_parquet_row_is_named(tmp_path, db):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "response": ["x", None, "z"]}), path)
    with pytest.raises(FileImportError, match=r"data.parquet, row 2: needs 'prompt' and 'response'"):
        expert_import.import_expert_data(path)


# ---- the job and the upload page ----


def upload(name: str, rows) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(json.dumps(row) + "\n" for row in rows).encode())


def test_import_job_imports_and_deletes_its_upload(curator):
    job = expert_import.start_import(
        upload=upload("expert.jsonl", [{"prompt": "p", "response": "r"}] * 3), layout="sft", fmt="jsonl", user=curator
    )
    upload_path = job.upload.path

    job = run_job("buffer.bufferjob", job.pk)

    assert (job.status, job.result, job.rows_done, job.bytes_done, job.percent) == (
        "succeeded",
        {"rows": 3, "dataset": "expert", "appended": False, "holds": 3},
        3,
        job.bytes_total,  # the whole file read
        100,
    )
    assert Experience.objects.count() == 3 and not job.upload
    import os

    assert not os.path.exists(upload_path)


def test_failed_import_job_holds_the_error(curator):
    job = expert_import.start_import(upload=upload("bad.jsonl", [{"prompt": "p"}]), layout="sft", fmt="jsonl",
                                     user=curator)
    job = run_job("buffer.bufferjob", job.pk)
    assert job.status == "failed" and job.error.startswith("bad.jsonl, line 1: needs 'prompt' and 'response'")
    assert not Experience.objects.exists()
    assert run_job("buffer.bufferjob", job.pk).status == "failed"  # a redelivered task leaves a finished job alone


def test_upload_page(curator_client, curator):
    url = reverse("admin:buffer_experience_import")
    assert "Import expert data" in curator_client.get(url).content.decode()
    assert "Import expert data" in curator_client.get("/admin/buffer/experience/").content.decode()

    bad = curator_client.post(url, {"file": SimpleUploadedFile("x.txt", b"{}"), "layout": "sft", "format": "auto"})
    # Only what expert data is read from: a CSV named here would then be refused.
    assert bad.status_code == 200 and "unknown format: cannot tell it from the extension (expert data is read from " \
        ".jsonl, .ndjson, .parquet, .pq)" in bad.content.decode()

    response = curator_client.post(
        url,
        {
            "file": upload("pairs.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}]),
            "layout": "dpo",
            "format": "auto",
        },
    )
    job = BufferJob.objects.get()
    assert response["Location"] == reverse("admin:buffer_bufferjob_change", args=[job.pk])
    assert (job.kind, job.params, job.original_filename, job.created_by) == (
        "import",
        {"dataset": "pairs", "append": False, "layout": "dpo", "format": "jsonl"},
        "pairs.jsonl",
        curator,
    )
    assert run_job("buffer.bufferjob", job.pk).result == {"pairs": 1, "dataset": "pairs", "appended": False, "holds": 1}
    assert "pairs.jsonl" in curator_client.get(response["Location"]).content.decode()


def test_the_job_page_counts_pairs_and_rows_as_the_file_does(curator_client, curator):
    """5 DPO pairs are 10 experiences; their author counts 5 pairs, and so do the job page and the
    datasets page."""
    pairs = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(5)]
    for name, rows, layout in (("pairs.jsonl", pairs, "dpo"), ("answers.jsonl", pairs[:3], "sft")):
        if layout == "sft":
            rows = [{"prompt": row["prompt"], "response": row["chosen"]} for row in rows]
        job = expert_import.start_import(upload=upload(name, rows), layout=layout, fmt="jsonl", user=curator)
        job = run_job("buffer.bufferjob", job.pk)
        page = curator_client.get(reverse("admin:buffer_bufferjob_change", args=[job.pk])).content.decode()
        imported = {"dpo": "imported 5 pairs into the new dataset &#x27;pairs&#x27;",
                    "sft": "imported 3 rows into the new dataset &#x27;answers&#x27;"}[layout]
        assert imported in page and job.rows_done == len(rows)
    assert Experience.objects.count() == 13
    listing = curator_client.get(reverse("admin:buffer_expertdataset_changelist")).content.decode()
    assert ">5 pairs<" in listing and ">3 rows<" in listing


# ---- importing into a dataset that is there ----


def test_the_same_export_imported_again_is_refused_unless_asked_to_add_to_its_dataset(tmp_path, db):
    """The same file as .jsonl, then as .parquet, went twice into the dataset named after it: each row
    there twice, and the job said only 'imported: 3 rows'."""
    rows = [{"prompt": f"p{i}", "response": "r"} for i in range(3)]
    first = expert_import.import_expert_data(write_jsonl(tmp_path / "export.jsonl", rows))
    assert (first.appended, first.holds, str(first)) == (False, 3, "imported 3 rows into the new dataset 'export'")
    again = tmp_path / "export.parquet"
    pq.write_table(pa.Table.from_pylist(rows), again)

    with pytest.raises(FileImportError, match="export.parquet: the dataset 'export' exists and holds 3 rows: name a "
                                              "new one, or ask to add this file's rows to it"):
        expert_import.import_expert_data(again)
    assert Experience.objects.count() == 3

    added = expert_import.import_expert_data(again, append=True)
    assert (added.rows, added.appended, added.holds) == (3, True, 6)
    assert str(added) == "added 3 rows to the existing dataset 'export', which now holds 6 rows"
    assert expert_import.import_expert_data(again, dataset="export-2").appended is False


def test_the_upload_page_asks_before_adding_to_a_dataset_and_says_it_did(curator_client, curator):
    url = reverse("admin:buffer_experience_import")
    rows = [{"prompt": f"p{i}", "response": "r"} for i in range(3)]
    first = curator_client.post(url, {"file": upload("answers.jsonl", rows), "layout": "sft", "format": "auto"})
    assert first.status_code == 302
    run_job("buffer.bufferjob", BufferJob.objects.get().pk)
    page = curator_client.post(url, {"file": upload("answers.jsonl", rows), "layout": "sft", "format": "auto"})
    assert page.status_code == 200 and BufferJob.objects.count() == 1, "the second upload was refused, no job"
    assert ("The dataset &#x27;answers&#x27; exists and holds 3 rows: name a new one, or tick “Add to an existing "
            "dataset” to add this file&#x27;s rows to it.") in page.content.decode()

    added = curator_client.post(url, {"file": upload("answers.jsonl", rows), "layout": "sft", "format": "auto",
                                      "append": "on"})
    job = run_job("buffer.bufferjob", BufferJob.objects.latest("pk").pk)
    assert job.params["append"] is True and Experience.objects.count() == 6
    said = curator_client.get(added["Location"]).content.decode()
    assert "added 3 rows to the existing dataset &#x27;answers&#x27;, which now holds 6 rows" in said


def test_an_import_queued_before_the_choice_adds_to_its_dataset_as_it_did_then(curator):
    """A job's params had no `append`: imports then added to a dataset of their name."""
    rows = [{"prompt": "p", "response": "r"}]
    for _ in range(2):
        job = expert_import.start_import(upload=upload("old.jsonl", rows), layout="sft", fmt="jsonl", user=curator)
        BufferJob.objects.filter(pk=job.pk).update(params={"dataset": None, "layout": "sft", "format": "jsonl"})
        job = run_job("buffer.bufferjob", job.pk)
    assert job.result == {"rows": 1, "dataset": "old", "appended": True, "holds": 2}
