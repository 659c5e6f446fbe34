"""Full-text search of the buffer. Postgres: documents made after the write, found by the admin.
SQLite (the embedded mode): an FTS5 index kept by triggers in the write (migration 0014), read
with the same syntax (`websearch_q`).

An insert into the buffer notes the range of ids each statement wrote (buffer_search_pending,
migration 0008) instead of computing tsvectors inside the explorer's COPY; `index_pending` turns
pending ranges into documents (models.ExperienceSearch). It runs on a worker every
RFTWEB_SEARCH_INDEX_INTERVAL seconds (beat), and the admin calls `catch_up` before it searches,
so a search finds every committed row unless a backlog outlasts the catch-up's budget (a million-
row import), which the admin then says. A range is noted when its statement commits, never
before: a range covers ids that other transactions wrote in between, but each of those notes its
own, so no committed row is missed however the transactions interleave; documents already made
are left as they are (an edit rewrote it at once: its trigger).
"""
import re
import sqlite3
import time
from contextlib import closing

from django.db import connection
from django.db.models import Q
from django.db.models.expressions import RawSQL

from .models import Experience, ExperienceSearch

RANGES_PER_ROUND = 64  # 64 explorer batches of 128 rows: ~0.5 s of tsvectors a round here
CATCH_UP_SECONDS = 2.0  # what an admin search waits at most for the documents of recent writes
EXPERIENCES, DOCUMENTS = Experience._meta.db_table, ExperienceSearch._meta.db_table

# The ids of the ranges taken go to the primary key as an array (id = ANY): joined on BETWEEN, the
# planner did not know how few ranges it took and read every id of the table (a merge anti join
# over the primary key: 1 s at 2 x 10^5 rows, linear in the table), where the array is probed id
# by id (3,840 documents in 0.46 s at 2 x 10^5, bench/README). Concurrent writers interleave their
# ids, so ranges overlap (the array's duplicates are probed once), and rows with a document
# already (an earlier range's, an edit's) are skipped before any text is parsed.
_INDEX = f"""
WITH taken AS (
    DELETE FROM buffer_search_pending WHERE id IN (
        SELECT id FROM buffer_search_pending ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
    ) RETURNING first_id, last_id
), made AS (
    INSERT INTO {DOCUMENTS} (experience_id, document)
    SELECT e.id, buffer_search_document(e.prompt_text, e.response_text) FROM {EXPERIENCES} e
    WHERE e.id = ANY(ARRAY(SELECT generate_series(first_id, last_id) FROM taken))
      AND NOT EXISTS (SELECT 1 FROM {DOCUMENTS} s WHERE s.experience_id = e.id)
    ON CONFLICT (experience_id) DO NOTHING RETURNING 1
)
SELECT (SELECT count(*) FROM taken), (SELECT count(*) FROM made),
       -- the statement's snapshot still sees the ranges it took: more than those, and some are left
       (SELECT count(*) FROM (SELECT 1 FROM buffer_search_pending LIMIT %s + 1) AS p)
"""


def enabled() -> bool:
    return connection.vendor == "postgresql"


def index_pending(ranges: int = RANGES_PER_ROUND) -> tuple[int, bool]:
    """Make the documents of up to `ranges` pending ranges; returns how many were made and whether
    ranges are left (more, or held by another indexer: SKIP LOCKED, so concurrent callers take
    different ranges)."""
    if not enabled():
        return 0, False
    with connection.cursor() as cursor:
        cursor.execute(_INDEX, [ranges, ranges])
        taken, made, seen = cursor.fetchone()
        return made, seen > taken


def backlog() -> int:
    """About how many written rows have no document yet (the ids the pending ranges span)."""
    if not enabled():
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(last_id - first_id + 1), 0) FROM buffer_search_pending")
        return int(cursor.fetchone()[0])


def catch_up(seconds: float | None = None) -> int:
    """Index pending ranges until none is left or `seconds` have passed (the beat task's round,
    and the admin's wait before a search); returns the backlog left (0: every committed row is
    searchable)."""
    if not enabled():
        return 0
    deadline = time.monotonic() + (CATCH_UP_SECONDS if seconds is None else seconds)
    while time.monotonic() < deadline:
        made, left = index_pending()
        if not left:
            return 0
        if not made:
            time.sleep(0.05)  # what is left is another indexer's, or held no new rows
    return backlog()


# One term of websearch_to_tsquery's syntax: -? then "a phrase" (closed or not) or a word.
_TERM = re.compile(r'(-?)(?:"([^"]*)"?|(\S+))')
FTS = "buffer_experience_fts"  # migration 0014
TOKENIZER = "unicode61 remove_diacritics 0"  # the index's, as migration 0014 made it
TEXTS = ("prompt_text", "response_text")  # what a search reads: the index's columns
_TOKEN_CHARS: dict[str, bool] = {}  # a non-ASCII letter or digit: whether the index reads it as one (_read_alike)


def websearch_q(term: str) -> Q:
    """Postgres' websearch syntax (words, "a phrase", -excluded, or) as a filter over the texts,
    reading text word by word (letters and digits; "_" parts them) as its 'simple' parser mostly
    does: the embedded (SQLite) mode's search. A substring search there found "pineapple" for
    apple, 13,000 rows for "+" (Postgres: none, no word in it) and none for "-3". Words bind
    tighter than `or`: "a b or c" is (a and b) or c. Over 41,680 demo rows the two modes agreed on
    every query tried but a sign glued to a number: Postgres reads "3+4" as 3 and +4, finding none."""
    alternatives, terms = [], []
    tokens = _TERM.findall(term)
    operator = [not negated and word.lower() == "or" for negated, _, word in tokens]
    for i, (negated, phrase, word) in enumerate(tokens):
        # `or` between two terms; alone or at an end it is the word, as Postgres reads it ("or"
        # found nothing here and 23 rows there).
        if operator[i] and terms and not all(operator[i + 1:]):
            alternatives.append(terms)
            terms = []
            continue
        words = re.findall(r"[^\W_]+", phrase or word)
        if words:  # no word in it: the simple parser finds nothing to match either
            terms.append((bool(negated), words))
    alternatives.append(terms)
    wanted = Q(pk__in=[])  # nothing to match: Postgres finds no row either
    for each in alternatives:
        if each:
            wanted |= _all_of(each)
    return wanted


def _all_of(terms: list[tuple[bool, list[str]]]) -> Q:
    """The rows with every term's words in a row in either text, and none of a negated term's: one
    lookup in the FTS5 index for the terms it reads as the regex does (`_read_alike`), a regex a row
    for the others. The index's terms are one MATCH where one is wanted ("a" AND "b" NOT "c"): two
    subqueries of 'word2' and 'word5' counted 45,470 of 2 x 10^5 rows in 175 ms of CPU, one in 74."""
    indexed = [(negated, '"' + " ".join(words) + '"') for negated, words in terms if _read_alike(words)]
    wanted, found = [phrase for negated, phrase in indexed if not negated], Q()
    if wanted:  # FTS5's NOT takes a left side: excluded phrases follow a wanted one
        found &= _matching(f"({' AND '.join(wanted)})" + "".join(f" NOT {p}" for n, p in indexed if n))
    else:
        for _, phrase in indexed:
            found &= ~_matching(phrase)
    for negated, words in terms:
        if not _read_alike(words):
            found &= ~_regex(words) if negated else _regex(words)
    return found


def _matching(query: str) -> Q:
    """The rows the FTS5 query matches (its phrases are quoted letters and digits: nothing to escape)."""
    return Q(pk__in=RawSQL(f"SELECT rowid FROM {FTS} WHERE {FTS} MATCH %s", [query]))


def _read_alike(words: list[str]) -> bool:
    """Whether the index's tokenizer reads each of the regex's words as one word: whether it takes
    each of their letters and digits for one. It knows Unicode 6.1 (SQLite's tables), Python's
    regex a later one: 21 New Tai Lue letters (U+19B0...) are letters to the regex and part words
    in the index, and a word of them would be searched for as other words, or as none."""
    chars = {char for word in words for char in word if not char.isascii()}  # ASCII's: both the same
    if unknown := chars - _TOKEN_CHARS.keys():
        # Asked of SQLite itself, in memory, once a character a process (0.5 ms a question here).
        with closing(sqlite3.connect(":memory:")) as tokens:
            tokens.execute(f"CREATE VIRTUAL TABLE chars USING fts5(char, tokenize='{TOKENIZER}')")
            tokens.execute("CREATE VIRTUAL TABLE read USING fts5vocab(chars, 'instance')")
            tokens.executemany("INSERT INTO chars (rowid, char) VALUES (?, ?)", ((ord(c), c) for c in unknown))
            read = dict(tokens.execute("SELECT doc, count(*) FROM read GROUP BY doc"))
        _TOKEN_CHARS.update((char, read.get(ord(char)) == 1) for char in unknown)
    return all(_TOKEN_CHARS[char] for char in chars)


def _regex(words: list[str]) -> Q:
    """The rows with the words in a row in either text, a regex a row (no index)."""
    first = re.escape(words[0])
    # The look behind (no letter or digit just before the first word) follows that word: leading,
    # it ran at every character of every text. 'word900' over 2 x 10^5 texts: 474 ms of CPU
    # before, 194 ms after.
    pattern = rf"{first}(?<![^\W_]{first})" + "".join(rf"[\W_]+{re.escape(w)}" for w in words[1:]) + r"(?![^\W_])"
    found = Q()
    for field in TEXTS:
        found |= Q(**{f"{field}__iregex": pattern})
    return found
