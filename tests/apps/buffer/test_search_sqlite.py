"""The embedded mode's buffer search (SQLite): an FTS5 index kept by triggers (migration 0014),
read with Postgres' websearch syntax (apps/buffer/search.py), finding what the regex a row found.
SQLite only: Postgres' index is test_admin's."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.buffer import search
from apps.buffer.models import Experience


@pytest.fixture(autouse=True)
def sqlite_only(db):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's FTS5 index; Postgres has a tsvector table of its own")


def indexed(phrase: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT rowid FROM {search.FTS} WHERE {search.FTS} MATCH %s ORDER BY rowid", [phrase])
        return [row[0] for row in cursor.fetchall()]


def found(term: str) -> list[int]:
    return list(Experience.objects.filter(search.websearch_q(term)).order_by("pk").values_list("pk", flat=True))


def test_the_index_and_its_triggers_outlive_every_migration():
    """SQLite drops a table's triggers with it, and Django remakes a table to alter a column: a
    migration that alters buffer_experience must make them again."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'buffer_experience'")
        assert {row[0] for row in cursor.fetchall()} == {
            "buffer_experience_fts_insert", "buffer_experience_fts_delete", "buffer_experience_fts_update"}


def test_the_index_follows_inserts_edits_and_deletes(make_experience):
    kept = make_experience(prompt_text="Bake an apple tart", response_text="Done.")
    edited = make_experience(prompt_text="Bake something", response_text="a cherry pie")
    gone = make_experience(prompt_text="Bake bread", response_text="a loaf")
    assert indexed("bake") == [kept.pk, edited.pk, gone.pk]
    Experience.objects.filter(pk=edited.pk).update(response_text="a plum pie")
    Experience.objects.filter(pk=kept.pk).update(status=Experience.Status.CONSUMED)  # no text: no index write
    gone.delete()
    assert indexed("cherry") == [] and indexed("plum") == [edited.pk] and indexed("bake") == [kept.pk, edited.pk]
    with connection.cursor() as cursor:  # the index agrees with the texts it indexes, row by row
        cursor.execute(f"INSERT INTO {search.FTS} ({search.FTS}, rank) VALUES ('integrity-check', 1)")


def test_a_search_is_a_lookup_in_the_index_not_a_regex_a_row(make_experience):
    make_experience(prompt_text="Bake an apple tart", response_text="Done.")
    query = Experience.objects.filter(search.websearch_q('apple "an apple" -pie or cherry'))
    with CaptureQueriesContext(connection) as captured:
        list(query)
    assert "MATCH" in captured[0]["sql"] and "REGEXP" not in captured[0]["sql"].upper()
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert f"SCAN {search.FTS} VIRTUAL TABLE INDEX" in plan


TEXTS = [
    ("Bake something", "An apple pie, then a cherry pie."), ("Bake an apple tart", "Done."), ("Unrelated", "pineapple"),
    ("What is 3 + 4?", "7"), ("say 4_st", "done"), ("pi is 3.14", "word-with-dash"),
    ("café au lait", "cafe"), ("Straße", "STRASSE"), ("ΣΟΦΙΑ", "σοφια ὈΔΥΣΣΕΎΣ"), ("नमस्ते दुनिया", "東京都に行く"),
    ("Привет МИР", "ﬁne Ⅻ x²"), ("ſtop", "emoji 🙂 ok"),
]
TERMS = [
    "apple", "apple pie", '"cherry pie"', "apple -pie", "APPLE", "ppl", "tart or cherry", "bake tart or cherry", "+",
    "3 -7", "-3 bake", '"is 3 4"', '"apple cherry"', "4", "st", "3.14", "14", "word dash", '"with-dash"', "-apple",
    "-apple -pie", "café", "cafe", "CAFÉ", "straße", "strasse", "σοφια", "ὀδυσσεύς", "नमस्ते", "दुनिया", "東京",
    "東京都に行く", "мир", "ПРИВЕТ", "fine", "ﬁne", "ⅻ", "x", "x²", "STOP", "🙂 ok", "",
]


@pytest.mark.parametrize("term", TERMS)
def test_the_index_finds_what_the_regex_found(make_experience, monkeypatch, term):
    """Words, phrases, exclusions, or, case, punctuation, digits and non-ASCII (folded case, kept
    accents, ligatures, scripts without spaces): the same rows either way."""
    for prompt, response in TEXTS:
        make_experience(prompt_text=prompt, response_text=response)
    by_index = found(term)
    monkeypatch.setattr(search, "_read_alike", lambda words: False)  # every term a regex a row, as before
    assert by_index == found(term)


def test_a_word_the_index_reads_otherwise_is_searched_by_regex(make_experience):
    """SQLite's tokenizer knows Unicode 6.1: New Tai Lue's vowel signs (U+19B0...) are letters to
    Python's regex and part words in the index, where ᦶᦰ would be no word at all."""
    tai_lue = make_experience(prompt_text="ᦶᦰ", response_text="x")
    assert indexed('"ᦶᦰ"') == []
    assert not search._read_alike(["ᦶᦰ"]) and search._read_alike(["東京都", "café"])
    assert found("ᦶᦰ") == [tai_lue.pk] and found("ᦶᦰ x") == [tai_lue.pk] and found("-ᦶᦰ") == []


def test_or_is_an_operator_between_terms_and_else_the_word_as_postgres_reads_it(make_experience):
    """`text=or` on the annotation queue's filter found nothing here and 23 rows on Postgres."""
    either = make_experience(prompt_text="this or that", response_text="x")
    cherry = make_experience(prompt_text="a cherry", response_text="y")
    assert found("or") == found("OR") == found("that or") == [either.pk]
    assert found("or cherry") == [] and found("that or cherry") == [either.pk, cherry.pk]
