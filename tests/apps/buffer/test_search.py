"""The buffer's search documents, made after the write (apps/buffer/search.py): every committed
row gets exactly one, whatever order concurrent writers commit in, and none outlives its row."""
import threading

import pytest
from django.contrib.postgres.search import SearchQuery
from django.db import connection, transaction

from apps.buffer import search, services
from apps.buffer.models import Experience, ExperienceSearch
from apps.buffer.store import DjangoExperienceBuffer
from apps.runs.models import Run
from workers.rft.experience import Experience as EngineExperience

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("search documents are Postgres's")


def rollouts(step: int, word: str, n: int = 16) -> list[EngineExperience]:
    return [
        EngineExperience(None, f"{step}-{i // 4}", i, [1, 2], [3, 4], [1, 1], logprobs=[-0.5, -0.5],
                         explorer_step=step, response_text=f"{word} number{i}")
        for i in range(n)
    ]


def matching(word: str) -> int:
    return Experience.objects.filter(search__document=SearchQuery(word, config="simple")).count()


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


def test_the_beat_task_makes_the_documents_of_what_was_written(run):
    from workers.tasks import index_search

    DjangoExperienceBuffer(run.pk).write(rollouts(0, "walnut"))
    assert matching("walnut") == 0
    assert index_search() == 0  # no backlog left
    assert matching("walnut") == 16
    assert ExperienceSearch.objects.count() == 16


def test_a_range_that_commits_after_a_later_one_was_indexed_is_not_missed(run):
    """Ids are taken at insert and committed in any order: an indexer that kept a high-water mark
    of ids would skip the slower writer's rows for ever."""
    slow_has_written, fast_indexed = threading.Event(), threading.Event()
    errors = []

    def slow_writer():
        try:
            with transaction.atomic():
                DjangoExperienceBuffer(run.pk).write(rollouts(1, "hazel"))  # the lower ids
                slow_has_written.set()
                assert fast_indexed.wait(30)
        except Exception as error:  # noqa: BLE001 - shown by the assertion below
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert slow_has_written.wait(30)
    DjangoExperienceBuffer(run.pk).write(rollouts(2, "pecan"))  # higher ids, committed first
    assert search.catch_up() == 0
    assert (matching("pecan"), matching("hazel")) == (16, 0)
    fast_indexed.set()
    thread.join(30)
    assert not errors
    assert search.catch_up() == 0
    assert (matching("pecan"), matching("hazel")) == (16, 16)


def test_interleaved_writers_get_one_document_a_row(run):
    """Concurrent COPYs interleave their ids, so their noted ranges overlap: every row gets its
    document, and no more than one (the indexer counts the documents it stored)."""
    barrier, errors = threading.Barrier(4), []

    def writer(k):
        try:
            barrier.wait(30)
            for step in range(5):
                DjangoExperienceBuffer(run.pk).write(rollouts(100 * k + step, "almond", n=64))
        except Exception as error:  # noqa: BLE001 - shown by the assertion below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    made, left = 0, True
    while left:
        count, left = search.index_pending()
        made += count
    assert made == Experience.objects.count() == 4 * 5 * 64
    assert matching("almond") == 4 * 5 * 64
    assert search.backlog() == 0


def test_a_rolled_back_write_leaves_nothing_to_index(run):
    with pytest.raises(RuntimeError), transaction.atomic():
        DjangoExperienceBuffer(run.pk).write(rollouts(3, "chestnut"))
        raise RuntimeError("the step failed after its write")
    assert search.backlog() == 0


def test_deleting_experiences_deletes_their_documents(run):
    DjangoExperienceBuffer(run.pk).write(rollouts(4, "acorn"))
    search.catch_up()
    assert ExperienceSearch.objects.count() == 16
    services.delete_experiences(Experience.objects.filter(rollout_index__lt=10))
    assert ExperienceSearch.objects.count() == matching("acorn") == 6


def test_the_indexer_probes_the_ids_it_took_and_reads_no_other_row(run):
    """Joined on BETWEEN, the ranges taken read every id of the table (1 s at 2 x 10^5 rows)."""
    DjangoExperienceBuffer(run.pk).write(rollouts(5, "filbert"))
    search.catch_up()
    DjangoExperienceBuffer(run.pk).write(rollouts(6, "cashew"))  # the 16 rows pending, of 32
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the planner show its index use
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + search._INDEX, [64, 64])
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    reads = [
        node["Actual Rows"] + node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
        for node in nodes(plan[0]["Plan"])
        if node.get("Relation Name") == "buffer_experience" or node.get("Index Name") == "buffer_experience_pkey"
    ]
    assert reads and max(reads) == 16, reads
