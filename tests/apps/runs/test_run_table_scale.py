"""The runs list on 200 generated runs of 2,000 explorer and trainer steps each (bench/runs_table.py
makes them and their summaries, and prints the same figures): each kind of sort answers a page
within a bounded number of queries and a second of server time, in the order a scan of every point
in Python gives."""

import pytest

from apps.runs.models import MetricPoint, Run
from bench.runs_table import generate_runs, list_cases, time_list

pytestmark = [pytest.mark.slow, pytest.mark.django_db,
              pytest.mark.postgres("the generator writes its points with generate_series")]

RUNS, STEPS = 200, 2000
# Session, user, roles, saved columns, the picker's metrics (one, from the summaries), count, page
# (and its SET LOCAL jit, in a savepoint), its metric columns, the owners; the CSV's chunks.
MAX_QUERIES = 14


@pytest.fixture(scope="module")
def many_runs(django_db_setup, django_db_blocker):
    """Generated once for the module and committed; deleted at its end."""
    from apps.accounts.roles import RESEARCHER
    from apps.accounts.services import create_user

    with django_db_blocker.unblock():
        owner = create_user("scale-researcher", "scale-password-123", roles=[RESEARCHER])
        try:
            yield owner, generate_runs(RUNS, STEPS, owner)
        finally:
            Run.objects.filter(owner=owner).delete()
            owner.delete()


def test_every_sort_answers_a_page_in_under_a_second(many_runs, client):
    client.force_login(many_runs[0])
    for name, url in list_cases().items():
        client.get(url)  # warm
        seconds, queries, status = time_list(client, url, repeat=3)
        print(f"{name}: {seconds * 1000:.0f} ms, {queries} queries")
        # A group opened in place reads its runs' cells too: 16, at 40 runs as at 200 and 400
        # (python bench/runs_table.py --runs 40 / 400 --steps 100).
        limit = MAX_QUERIES + 2 if "one open" in name else MAX_QUERIES
        assert status == 200 and queries <= limit, (name, status, queries)
        assert seconds < (2.0 if "CSV" in name else 1.0), (name, seconds)


def test_the_best_sort_is_the_order_of_every_point(many_runs, client):
    client.force_login(many_runs[0])
    best = {}
    for run_id, values in MetricPoint.objects.filter(role="explorer").values_list("run", "values").iterator():
        best[run_id] = max(best.get(run_id, float("-inf")), values["reward_mean"])
    expected = sorted(best, key=lambda run_id: (-best[run_id], -run_id))[:50]
    page = client.get("/runs/", {"sort": "-best:explorer/reward_mean", "cols": "best:explorer/reward_mean"})
    assert [run.pk for run in page.context["runs"]] == expected
    shown = [float(cell["title"].rsplit(": ", 1)[1])
             for run in page.context["runs"] for _, cell in run.columns_and_cells]
    assert shown == [best[run_id] for run_id in expected]
