"""A bench (Evaluate) run still queued or evaluating shows in the model's score cell for its eval
taskset, on the list and the model page, linked to the run; once finished its score replaces it."""
import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs.models import Run
from apps.runs.services import record_metrics
from apps.saved_models import evaluation, services

from .test_evaluation import bench_run, source  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def cell(html: str, model: str) -> str:
    return html.split(f'id="model-{model}"')[1].split("</tr>")[0]


def test_a_queued_or_running_bench_run_shows_in_its_score_cell_until_it_scores(
        researcher_client, source, researcher, make_run):  # noqa: F811
    warm = services.save_model(source, 5, "warm", researcher)
    queued = bench_run(make_run, warm, "words-eval", status=Run.Status.QUEUED)
    running = bench_run(make_run, warm, "sums-eval", status=Run.Status.RUNNING)
    Run.objects.filter(pk=running.pk).update(started_at=timezone.now())
    bench_run(make_run, warm, "sums-eval", status=Run.Status.FAILED)  # ended: neither a score nor pending
    training = make_run("trains from warm", status=Run.Status.RUNNING, config={
        "mode": "both", "model": {"path": str(services.model_dir(warm))},
        "buffer": {"taskset": "sums", "eval_taskset": "sums-eval"}})  # trains from it: not its evaluation

    page = researcher_client.get(reverse("model-list"))
    assert page.context["tasksets"] == ["sums-eval", "words-eval"]
    html = cell(page.content.decode(), "warm")
    assert "Not evaluated yet" not in html
    sums, words = [part.split("</td>")[0] for part in html.split('<td class="score">')[1:3]]
    assert f'<a href="{reverse("run-detail", args=[running.pk])}"' in sums
    assert '<span class="status running">running</span>' in sums and "since just now" in sums
    assert f'<a href="{reverse("run-detail", args=[queued.pk])}"' in words and "status queued" in words
    assert "queued just now" in words
    assert f'href="{reverse("run-detail", args=[training.pk])}"' not in sums + words  # under "Trained from it"
    detail = researcher_client.get(reverse("model-detail", args=["warm"])).content.decode()
    assert f'<a href="{reverse("run-detail", args=[running.pk])}"' in detail.split('id="model-scores"')[1]

    # Finished, its score takes the cell's place.
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED)
    record_metrics(running, "eval", 0, {"exact_match": 0.5, "tasks": 20, "model_version": 0})
    sums = cell(researcher_client.get(reverse("model-list")).content.decode(), "warm").split('<td class="score">')[1]
    assert ">0.500</a>" in sums and "status running" not in sums


def test_pending_asks_nothing_of_the_database(source, researcher, make_run, django_assert_num_queries):  # noqa: F811
    warm = services.save_model(source, 5, "warm", researcher)
    run = bench_run(make_run, warm, "sums-eval", status=Run.Status.PAUSED)
    naming = services.runs_naming([warm])
    with django_assert_num_queries(0):
        assert evaluation.pending([warm], naming) == {warm.pk: {"sums-eval": [run]}}
