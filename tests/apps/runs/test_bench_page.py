"""A bench run (mode bench: it scores a saved model on an eval taskset and trains nothing) has the
page of an evaluation: the model it evaluated (linked to its page), the taskset, each score under
its metric's name and every eval metric, and its config without the training settings. Its page
showed a training run's: trainer.lr in the config, the algorithm it never ran, the human feedback
panel, the checkpoint table, the train reward and throughput figures. A GRPO run's page keeps them.
The API's run answers the same evaluation (`evaluation`; null for a run that trains), the whole
config as launched still."""
import json

import pytest
from django.urls import reverse

from apps.runs.models import Run
from apps.runs.services import record_metrics
from apps.saved_models import services
from apps.saved_models.models import SavedModel
from workers.rft.config import RunConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def saved(researcher):
    """A saved model named warm, renamed from its first name (a bench of it may name either)."""
    return SavedModel.objects.create(name="warm", run_name="warm up", checkpoint_version=5, step=5,
                                     created_by=researcher, former_names=["warm-v1"])


def bench_run(make_run, model_path, status=Run.Status.COMPLETED, **config):
    config = RunConfig.from_dict({"mode": "bench", "buffer": {"taskset": "sums-eval", "eval_taskset": "sums-eval"},
                                  **config}).to_dict()
    config["model"]["path"] = model_path  # as a launch stores it: resolved
    return make_run("eval warm on sums-eval", mode=Run.Mode.BENCH, status=status, config=config)


def test_a_bench_runs_page_is_an_evaluations(researcher_client, make_run, saved):
    bench = bench_run(make_run, str(services.models_root() / "warm-v1"))  # launched before the rename
    record_metrics(bench, "eval", 0, {"exact_match": 0.625, "reward_mean": 0.7, "tasks": 40, "failed_tasks": 1,
                                      "model_version": 0, "response_length": 5.5})
    page = researcher_client.get(reverse("run-detail", args=[bench.pk])).content.decode()
    meta = page[page.index('id="bench-meta"'):page.index("</p>", page.index('id="bench-meta"'))]
    assert '<a href="/models/warm/"><bdi>warm</bdi></a> on <bdi>sums-eval</bdi>' in meta and "grpo" not in meta
    results = page[page.index('id="bench-results"'):page.index("</section>", page.index('id="bench-results"'))]
    assert "<td data-score>0.625</td>" in results and "<code>exact_match</code>" in results
    assert "<td>40</td><td>1</td>" in results and "<code>eval/response_length</code>" in results
    config = page[page.index('id="run-config"'):page.index("</section>", page.index('id="run-config"'))]
    assert "eval_taskset: sums-eval" in config and "lr:" not in config and "algorithm:" not in config
    for training in ('id="human-feedback"', 'id="run-checkpoints"', 'id="run-distributions"', "Train reward",
                     "Throughput", "feedback_summary.js", ">Rollouts</a>"):
        assert training not in page, training
    assert '<div class="label">Evaluation</div>' in page
    figures = json.loads(page.split('id="run-page-data" type="application/json">')[1].split("</script>")[0])
    assert [figure["id"] for figure in figures["figures"]] == ["heldout", "step"] and figures["bench"]
    # Its eval points are numbered by the model version they scored: its charts' x axis says so
    # (chart_axes.js), not "explorer step".
    assert figures["step_titles"] == {"eval": "model version evaluated"}

    api = researcher_client.get(reverse("api-run", args=[bench.pk])).json()
    # The model as the runs list and this page name it, relative to the data dir: the stored
    # path is the server's own layout (/srv/.../data/models/warm-v1).
    assert bench.config["model"]["path"] == str(services.models_root() / "warm-v1")
    assert api["config"]["trainer"]["lr"] == bench.config["trainer"]["lr"]  # the config as launched
    assert api["evaluation"] == {
        "model_path": "models/warm-v1", "saved_model": "warm", "eval_taskset": "sums-eval",
        "results": [{"step": 0, "model_version": 0, "metric": "exact_match", "score": 0.625, "tasks": 40,
                     "failed_tasks": 1, "metrics": {"exact_match": 0.625, "reward_mean": 0.7, "tasks": 40,
                                                    "failed_tasks": 1, "model_version": 0,
                                                    "response_length": 5.5}}]}


def test_a_bench_run_not_scored_yet_says_so_and_a_built_in_model_is_named_unlinked(researcher_client, make_run):
    bench = bench_run(make_run, "tiny-gpt2", status=Run.Status.RUNNING)
    page = researcher_client.get(reverse("run-detail", args=[bench.pk])).content.decode()
    assert "bench · evaluates <bdi>tiny-gpt2</bdi> on <bdi>sums-eval</bdi>" in page
    assert "No score yet: a bench run records its scores once it has answered every task" in page
    api = researcher_client.get(reverse("api-run", args=[bench.pk])).json()["evaluation"]
    assert (api["model_path"], api["saved_model"], api["results"]) == ("tiny-gpt2", None, [])


def test_a_grpo_runs_page_keeps_its_training_parts(researcher_client, make_run):
    config = RunConfig.from_dict({"algorithm": {"name": "grpo"}, "buffer": {"taskset": "sums"}}).to_dict()
    run = make_run("grpo", mode=Run.Mode.BOTH, status=Run.Status.COMPLETED, config=config)
    page = researcher_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    for training in ('id="human-feedback"', 'id="run-checkpoints"', 'id="run-distributions"', "lr:",
                     "both · grpo", ">Rollouts</a>"):
        assert training in page, training
    assert 'id="bench-results"' not in page and 'id="bench-meta"' not in page
    data = json.loads(page.split('id="run-page-data" type="application/json">')[1].split("</script>")[0])
    assert data["step_titles"] == {}  # its axes: chart_axes.js's explorer and trainer steps
    assert researcher_client.get(reverse("api-run", args=[run.pk])).json()["evaluation"] is None


def test_a_bench_runs_log_ends_with_its_evaluation_not_a_trainer_step(make_run, saved, caplog):
    """It trains nothing: its last line read "completed at trainer step 0" (the run's log file
    takes the line while a worker serves it: test_logs_served)."""
    from apps.runs import supervision

    run = bench_run(make_run, "models/warm", status=Run.Status.RUNNING)
    with caplog.at_level("INFO", logger=supervision.log.name):
        supervision.finish(run, Run.Status.RUNNING, None, "loop")
    assert f"run {run.pk} (loop): completed its evaluation" in caplog.messages
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
