"""import_taskset: good files in each format, the bad-file corpus, and streaming of large files."""

import tracemalloc

import pytest
from django.conf import settings

from apps.core.files import FileImportError
from apps.tasksets.importers import FieldMapping
from apps.tasksets.models import Task, Taskset
from apps.tasksets.services import import_taskset
from workers.rft.rewards.answer import exact_match

pytestmark = pytest.mark.django_db

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def tasks_of(name):
    return list(Task.objects.filter(taskset__name=name).order_by("index"))


def test_jsonl_with_text_and_chat_prompts_metadata_and_difficulty(files, researcher):
    path = files.jsonl(
        [
            {"question": "What is 1 + 1?", "answer": "2", "source": "hand", "level": 1, "ignored": "x"},
            {"question": CHAT, "answer": 4, "source": {"book": "b", "page": 3}, "level": "2.5"},
            "   ",  # blank lines are skipped
            {"question": "Name a colour.", "answer": "red", "source": None, "level": 0},
        ]
    )
    mapping = FieldMapping("question", "answer", metadata=["source"], difficulty="level")

    taskset = import_taskset(
        path, name="mixed", mapping=mapping, description="d", default_reward_fn="numeric", user=researcher
    )

    assert (taskset.task_count, taskset.source, taskset.created_by, taskset.default_reward_fn) == (
        3,
        "tasks.jsonl",
        researcher,
        "numeric",
    )
    assert taskset.field_mapping == {
        "format": "jsonl",
        "prompt": "question",
        "answer": "answer",
        "metadata": ["source"],
        "difficulty": "level",
    }
    first, chat, last = tasks_of("mixed")
    assert (first.index, first.prompt, first.answer, first.metadata, first.difficulty) == (
        0,
        "What is 1 + 1?",
        "2",
        {"source": "hand"},
        1.0,
    )
    assert (chat.prompt, chat.answer, chat.metadata, chat.difficulty) == (
        CHAT,
        "4",
        {"source": {"book": "b", "page": 3}},
        2.5,
    )
    assert chat.prompt_text == "system: Be brief.\nuser: What is 2 + 2?"
    assert (last.index, last.metadata) == (2, {"source": None})


def test_csv_with_quoted_newlines_bom_metadata_and_difficulty(tmp_path):
    path = tmp_path / "tasks.csv"
    path.write_bytes(
        b"\xef\xbb\xbfquestion,answer,topic,level\r\n"
        b'"Line one\nline two, with a comma",42,algebra,0.5\r\n'
        b"\r\n"
        b"Plain question,yes,logic,3\r\n"
    )
    mapping = FieldMapping("question", "answer", metadata=["topic"], difficulty="level")

    taskset = import_taskset(path, name="csv-set", mapping=mapping)

    first, second = tasks_of("csv-set")
    assert taskset.task_count == 2
    assert (first.prompt, first.answer, first.metadata, first.difficulty) == (
        "Line one\nline two, with a comma",
        "42",
        {"topic": "algebra"},
        0.5,
    )
    assert (second.prompt, second.answer, second.difficulty) == ("Plain question", "yes", 3.0)


def test_parquet_with_chat_prompts_metadata_and_difficulty(files):
    path = files.parquet(
        {
            "messages": [CHAT, [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "3 * 3?"}]],
            "solution": [4, 0, 9],
            "tags": [["a"], [], ["b", "c"]],
            "hardness": [0.1, 0.2, 0.3],
            "unused": ["x", "y", "z"],
        },
        row_group_size=2,
    )
    mapping = FieldMapping("messages", "solution", metadata=["tags"], difficulty="hardness")

    taskset = import_taskset(path, name="pq-set", mapping=mapping)

    tasks = tasks_of("pq-set")
    assert taskset.task_count == 3
    hi, product = [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "3 * 3?"}]
    assert [t.prompt for t in tasks] == [CHAT, hi, product]
    assert [t.answer for t in tasks] == ["4", "0", "9"]
    assert [t.metadata for t in tasks] == [{"tags": ["a"]}, {"tags": []}, {"tags": ["b", "c"]}]
    assert [t.difficulty for t in tasks] == [0.1, 0.2, 0.3]


def test_an_answer_that_is_not_text_is_stored_as_the_file_wrote_it_in_json(files, mapping):
    """str() stored `true` as "True" and `0.5e1` as "5.0"'s Python spelling: exact_match compares a
    non-number as text, and no reply to a true/false question writes "True"."""
    answers = ['true', 'false', '72', '-3', '0.25', '{"x": true, "y": null}', '[1, false]', '"yes"', '"True"']
    path = files.jsonl([f'{{"question": "q{i}", "answer": {answer}}}' for i, answer in enumerate(answers)])

    import_taskset(path, name="typed", mapping=mapping)

    stored = [t.answer for t in tasks_of("typed")]
    assert stored == ["true", "false", "72", "-3", "0.25", '{"x": true, "y": null}', "[1, false]", "yes", "True"]
    assert exact_match("<answer>true</answer>", {"answer": stored[0]}) == 1.0


def test_an_answer_from_a_parquet_boolean_column_is_json_too(files, mapping):
    path = files.parquet({"question": ["a", "b"], "answer": [True, False]})

    import_taskset(path, name="pq-bools", mapping=mapping)

    assert [t.answer for t in tasks_of("pq-bools")] == ["true", "false"]


# ---- the bad-file corpus: every case names the file, the line (or row) and the problem ----


def good(i):
    return {"question": f"q{i}", "answer": str(i)}


def after_good_rows(*lines):
    """Four good rows, then `lines`: with batches of 2 the good rows are inserted before the bad one."""
    return [good(i) for i in range(4)] + list(lines)


GOOD_CSV = b"question,answer\r\nq0,0\r\nq1,1\r\nq2,2\r\nq3,3\r\n"

# case: (write the file, file named in the error, line or row, problem)
BAD_FILES = {
    "bad JSON": (
        lambda f: f.jsonl(after_good_rows('{"question": "q", "answer": }')),
        "tasks.jsonl",
        5,
        "invalid JSON: Expecting value (column 29)",
    ),
    "not an object": (
        lambda f: f.jsonl(after_good_rows("[1, 2]")),
        "tasks.jsonl",
        5,
        "expected a JSON object, got an array",
    ),
    "missing key": (lambda f: f.jsonl(after_good_rows({"question": "q"})), "tasks.jsonl", 5, "missing field 'answer'"),
    "null answer": (
        lambda f: f.jsonl(after_good_rows({"question": "q", "answer": None})),
        "tasks.jsonl",
        5,
        "answer 'answer' is null",
    ),
    "bad chat prompt": (
        lambda f: f.jsonl(after_good_rows({"question": [{"role": "user"}], "answer": "a"})),
        "tasks.jsonl",
        5,
        "prompt 'question': message 1 has no string 'content'",
    ),
    "NUL character": (
        lambda f: f.jsonl(after_good_rows({"question": "a\u0000b", "answer": "1"})),
        "tasks.jsonl",
        5,
        "prompt 'question' must not contain a NUL character (\\x00), which the database cannot store",
    ),
    # SQLite stored a lone surrogate; Postgres refused the file with its own SQL and no line (a review).
    "lone surrogate": (
        lambda f: f.jsonl(after_good_rows('{"question": "a\\ud800b", "answer": "1"}')),
        "tasks.jsonl",
        5,
        "prompt 'question' must not contain a lone surrogate (\\ud800)",
    ),
    "CSV with a column twice": (  # the last one was kept without a word: the answer "WRONG"
        lambda f: f.raw(b"question,answer,answer\r\nq,2,WRONG\r\n", "twice.csv"),
        "twice.csv",
        1,
        "the header names 'answer' more than once",
    ),
    "empty file": (lambda f: f.raw(b"", "empty.jsonl"), "empty.jsonl", None, "the file has no rows"),
    "only blank lines": (lambda f: f.raw(b"\n  \n", "blank.jsonl"), "blank.jsonl", None, "the file has no rows"),
    "latin-1 text": (
        lambda f: f.raw(b'{"question": "q", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n', "latin1.jsonl"),
        "latin1.jsonl",
        2,
        "not valid UTF-8: byte 0xe9 at byte offset 50 of the file (byte 18 of the line)",
    ),
    "10 MB line": (
        lambda f: f.jsonl(after_good_rows({"question": "x" * 10_000_000, "answer": "1"})),
        "tasks.jsonl",
        5,
        "line is 10,000,032 bytes, over the limit of 1,048,576 bytes",
    ),
    "ragged CSV row": (
        lambda f: f.raw(GOOD_CSV + b"q4,4,extra\r\n", "ragged.csv"),
        "ragged.csv",
        6,
        "ragged row: 3 fields where the header has 2",
    ),
    "CSV without the answer column": (
        lambda f: f.raw(b"question,solution\r\nq,1\r\n", "nocol.csv"),
        "nocol.csv",
        1,
        "no column 'answer' in the header (columns: question, solution)",
    ),
    "CSV separated by semicolons": (  # Excel's CSV where the decimal mark is a comma
        lambda f: f.raw(b"question;answer\r\n1+1?;2\r\n", "excel.csv"),
        "excel.csv",
        1,
        "no column 'question', 'answer' in the header (columns: question;answer); the header is one column: "
        "is the file separated by ';'? CSV here is comma-separated",
    ),
    "CSV empty": (lambda f: f.raw(b"", "empty.csv"), "empty.csv", None, "the file has no rows"),
    "CSV header only": (
        lambda f: f.raw(b"question,answer\n", "header.csv"),
        "header.csv",
        None,
        "the file has no rows",
    ),
    "not parquet": (lambda f: f.raw(GOOD_CSV, "fake.parquet"), "fake.parquet", None, "not a readable Parquet file"),
    "parquet without the answer column": (
        lambda f: f.parquet({"question": ["q"], "solution": ["1"]}),
        "tasks.parquet",
        None,
        "no column 'answer' (columns: question, solution)",
    ),
    "parquet null prompt": (
        lambda f: f.parquet({"question": ["a", "b", "c", "d", None], "answer": list("12345")}),
        "tasks.parquet",
        5,
        "prompt 'question' must be a non-empty string or a list of chat messages {role, content}, got null",
    ),
    "answer too large for a float": (  # was stored as "inf", which no reply equals
        lambda f: f.jsonl(after_good_rows('{"question": "q", "answer": 1e999}')),
        "tasks.jsonl",
        5,
        "answer 'answer' is not finite (NaN, Infinity, or too large for a float, as 1e999 is)",
    ),
    "NaN answer": (
        lambda f: f.jsonl(after_good_rows('{"question": "q", "answer": NaN}')), "tasks.jsonl", 5,
        "answer 'answer' is not finite",
    ),
    "answer holding NaN": (
        lambda f: f.jsonl(after_good_rows('{"question": "q", "answer": [1, NaN]}')), "tasks.jsonl", 5,
        "answer 'answer' holds a number that is not finite",
    ),
    "5,000-digit answer": (  # Python's "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()"
        lambda f: f.jsonl(after_good_rows('{"question": "q", "answer": ' + "7" * 5_000 + "}")),
        "tasks.jsonl",
        5,
        "'answer' is a whole number of 5,000 digits; at most 4,300 are read (write it as a string to keep it)",
    ),
    "unknown format": (lambda f: f.raw(GOOD_CSV, "tasks.txt"), "tasks.txt", None,
                       "unknown format: cannot tell it from the extension (a taskset is read from .jsonl, .ndjson, "
                       ".csv, .parquet, .pq)"),
}


@pytest.mark.parametrize("case", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_file_is_rejected_whole_with_its_line_and_problem(case, files, mapping):
    write, file, line, problem = case
    path = write(files)

    with pytest.raises(FileImportError) as raised:
        import_taskset(path, name="bad", mapping=mapping, batch_size=2)

    error = raised.value
    assert (error.file, error.line) == (file, line)
    assert problem in error.message
    assert str(error).startswith(file if line is None else f"{file}, {error.unit} {line}: ")
    assert Taskset.objects.count() == 0 and Task.objects.count() == 0


def test_difficulty_that_is_not_a_number_names_the_row(files):
    path = files.csv(["question", "answer", "level"], [["q", "1", "1"], ["q", "2", "hard"]])

    with pytest.raises(FileImportError, match=r"tasks.csv, line 3: difficulty 'level' is 'hard', not a number"):
        import_taskset(path, name="bad", mapping=FieldMapping("question", "answer", difficulty="level"))


@pytest.mark.parametrize("value, read", [(None, "1048576"), ("2048", "2048"), ("0", "must be a number above 0")])
def test_the_line_limit_is_a_setting_from_the_environment(value, read):
    """It was read with getattr and a default, and set nowhere: the environment could not change it."""
    import os
    import subprocess
    import sys

    env = {key: val for key, val in os.environ.items() if key != "TASKSET_IMPORT_MAX_LINE_BYTES"}
    env |= {"SECRET_KEY": "x"} | ({} if value is None else {"TASKSET_IMPORT_MAX_LINE_BYTES": value})
    started = subprocess.run(
        [sys.executable, "-c", "import rftweb.settings as s; print(s.TASKSET_IMPORT_MAX_LINE_BYTES)"],
        cwd=settings_root(), capture_output=True, text=True, env=env, timeout=60,
    )
    assert read in started.stdout + started.stderr, started.stderr


def settings_root():
    from django.conf import settings

    return settings.BASE_DIR


def test_line_limit_is_configurable(files, mapping, settings):
    path = files.jsonl([good(0), {"question": "x" * 200, "answer": "1"}])
    settings.TASKSET_IMPORT_MAX_LINE_BYTES = 100

    with pytest.raises(FileImportError, match=r"line 2: line is 232 bytes, over the limit of 100 bytes"):
        import_taskset(path, name="small-lines", mapping=mapping)


def test_duplicate_name_is_rejected_before_reading(files, mapping):
    Taskset.objects.create(name="taken")
    path = files.jsonl([good(0)])

    with pytest.raises(FileImportError, match=r"tasks.jsonl: a taskset named 'taken' already exists"):
        import_taskset(path, name="taken", mapping=mapping)
    assert Task.objects.count() == 0


def test_a_name_taken_in_another_case_is_refused(files, mapping):
    Taskset.objects.create(name="good-csv")  # 'Good-CSV' beside it looked like the same taskset in the launch form
    taken = r"a taskset named 'good-csv' already exists \(names differ only in case\)"
    with pytest.raises(FileImportError, match=taken):
        import_taskset(files.jsonl([good(0)]), name="Good-CSV", mapping=mapping)
    assert Taskset.objects.count() == 1


def test_name_must_be_a_slug(files, mapping):
    with pytest.raises(FileImportError, match="'my set' is not a valid taskset name"):
        import_taskset(files.jsonl([good(0)]), name="my set", mapping=mapping)


def test_a_description_over_2000_characters_is_refused(files, mapping):
    """manage.py import_taskset --description took any length, as the API did."""
    with pytest.raises(FileImportError, match="tasks.jsonl: the description is 2,001 characters; at most 2,000"):
        import_taskset(files.jsonl([good(0)]), name="described", mapping=mapping, description="d" * 2001)
    assert not Taskset.objects.exists()


# ---- large files ----


def test_rows_are_inserted_in_batches_with_rising_progress(files, mapping):
    path = files.jsonl(good(i) for i in range(5_000))
    updates = []

    import_taskset(path, name="batched", mapping=mapping, batch_size=500, progress=updates.append)

    assert Taskset.objects.get(name="batched").task_count == Task.objects.count() == 5_000
    assert [u.rows_done for u in updates] == [*range(500, 5_001, 500), 5_000]
    size = path.stat().st_size
    assert all(u.bytes_total == size for u in updates)
    bytes_done = [u.bytes_done for u in updates]
    assert bytes_done == sorted(bytes_done) and 0 < bytes_done[0] < size and bytes_done[-1] == size


def test_parquet_progress_reaches_the_total(files, mapping):
    path = files.parquet(
        {"question": [f"q{i}" for i in range(5_000)], "answer": [str(i) for i in range(5_000)]}, row_group_size=1_000
    )
    updates = []

    import_taskset(path, name="pq-batched", mapping=mapping, batch_size=1_000, progress=updates.append)

    assert [u.rows_done for u in updates] == [1_000, 2_000, 3_000, 4_000, 5_000, 5_000]
    assert updates[-1].bytes_done == updates[-1].bytes_total == path.stat().st_size


@pytest.mark.slow
def test_100k_row_file_imports_in_bounded_memory(files, mapping):
    rows = 100_000
    path = files.jsonl(
        {"question": f"What is {i} + {i}? Answer with a number. " * 3, "answer": str(2 * i)} for i in range(rows)
    )
    size = path.stat().st_size
    updates = []

    tracemalloc.start()
    try:
        import_taskset(path, name="big", mapping=mapping, progress=updates.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert Task.objects.filter(taskset__name="big").count() == rows
    assert len(updates) == rows // settings.IMPORT_BATCH_ROWS + 1
    assert [u.rows_done for u in updates] == sorted(u.rows_done for u in updates)
    assert updates[-1].rows_done == rows and updates[-1].bytes_done == size
    # One batch of tasks is a few MB at most however long the file is (here ~17 MB).
    assert peak < size / 4, f"peak {peak:,} bytes for a {size:,}-byte file"


@pytest.mark.parametrize(
    "defaults, error",
    [
        ({"default_workflow": "no_such_flow"}, "unknown workflow 'no_such_flow'; known: multi_turn, single_turn"),
        ({"default_reward_fn": "vibes"}, "unknown reward fn 'vibes'; known: countdown, exact_match"),
    ],
)
def test_unknown_default_workflow_or_reward_fn_is_refused_before_reading(files, mapping, defaults, error):
    """A taskset naming an unregistered one would import, then fail every run launched on it."""
    with pytest.raises(FileImportError, match=error):
        import_taskset(files.jsonl([good(0)]), name="defaults", mapping=mapping, **defaults)
    assert not Taskset.objects.filter(name="defaults").exists()


def test_a_metadata_key_the_database_cannot_store_names_the_row(files):
    """Only values were checked: a NUL in a key imported on SQLite and failed on Postgres with its SQL."""
    path = files.jsonl([{**good(0), "m": {"a": 1}}, {**good(1), "m": {"a\u0000b": 1}}])
    with pytest.raises(FileImportError, match=r"tasks.jsonl, line 2: .*a metadata key must not contain a NUL"):
        import_taskset(path, name="bad", mapping=FieldMapping("question", "answer", metadata=["m"]))
    assert Taskset.objects.count() == 0
