"""Evaluating saved models: the Models page's Evaluate (a mode-bench launch form), its leaderboard
of eval scores (sorted by one, each linked to its run), how each run that names a model uses it,
the same in /api/models/, and who may see any of it."""
import json
import shutil

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Checkpoint, Run
from apps.runs.services import record_metrics
from apps.runs.supervision import run_dir
from apps.saved_models import services
from apps.saved_models.evaluation import evaluation
from apps.saved_models.models import SavedModel
from apps.tasksets.models import Taskset
from workers.rft.config import RunConfig

from .test_pages_and_api import full_config

pytestmark = pytest.mark.django_db
PROMPT = {"system_prompt": "Answer with the number.", "use_chat_template": False, "reward_fn": "numeric",
          "max_new_tokens": 6}


@pytest.fixture
def source(make_run):
    """A completed PPO run on sums that evaluated on sums-eval, with its checkpoint v5 at step 5."""
    run = make_run("warm up", status=Run.Status.COMPLETED, config=full_config(
        algorithm={"name": "ppo"}, trainer={"lr": 3e-6},
        explorer={**PROMPT, "eval_interval": 5, "engine_num": 2, "pipeline": [{"name": "reward_filter", "min": 0.1}]},
        synchronizer={"method": "checkpoint"}, mode="both",
        buffer={"taskset": "sums", "eval_taskset": "sums-eval"}))
    directory = run_dir(run) / "checkpoints" / "step_5"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    Checkpoint.objects.create(run=run, version=5, step=5, path=str(directory))
    yield run
    shutil.rmtree(run_dir(run), ignore_errors=True)
    for saved in SavedModel.objects.all():
        shutil.rmtree(services.model_dir(saved), ignore_errors=True)


def bench_run(make_run, saved, eval_taskset, status=Run.Status.COMPLETED, name=None, **scores):
    config = {"mode": "bench", "model": {"path": str(services.model_dir(saved))},
              "buffer": {"taskset": eval_taskset, "eval_taskset": eval_taskset}}
    run = make_run(name or f"bench {saved.name} {eval_taskset}", status=status, config=config)
    if scores:
        record_metrics(run, "eval", 0, {**scores, "tasks": 20, "model_version": 0})
    return run


def launch_fields(form) -> dict:
    fields = {field.name: "" if field.value() is None else str(field.value()) for field in form
              if field.widget_type != "checkbox" or field.value()}
    return {key: ("on" if value == "True" else value) for key, value in fields.items()}


def test_evaluate_opens_a_bench_run_of_the_model_on_its_source_runs_eval_taskset_prompt_and_reward(
        researcher_client, source, researcher):
    saved = services.save_model(source, 5, "warm", researcher)
    page = researcher_client.get(reverse("run-launch"), {"evaluate": "warm"})
    form = page.context["form"]
    assert (form["mode"].value(), form["model.path"].value(), form["buffer.eval_taskset"].value()) == (
        "bench", "models/warm", "sums-eval")
    assert form["name"].value() == "eval warm on sums-eval" and page.context["preset_name"] is None
    said = ("Evaluates warm on <bdi>sums-eval</bdi> (mode bench: it trains nothing) with the prompt format, "
            "workflow and reward of run <bdi>warm up</bdi>, which evaluated on it too")
    assert said in page.content.decode()
    config, _, _ = evaluation(saved)
    assert {key: config["explorer"][key] for key in PROMPT} == PROMPT
    assert config["explorer"]["workflow"] == source.config["explorer"]["workflow"]
    # What a bench run would leave doing nothing (refused): none of the source's training keys.
    assert (config["explorer"]["engine_num"], config["explorer"]["pipeline"], config["synchronizer"]["method"]) == (
        1, [], RunConfig().synchronizer.method)
    assert RunConfig.from_dict(config).mode == "bench"


def test_a_source_without_an_eval_taskset_leaves_it_to_pick_and_a_launch_without_one_is_refused(
        researcher_client, source, researcher):
    Taskset.objects.create(name="sums")
    Run.objects.filter(pk=source.pk).update(config=full_config(
        mode="train", algorithm={"name": "sft"}, buffer={"taskset": "sums", "expert_taskset": "sums"},
        explorer={"use_chat_template": False}))
    services.save_model(source, 5, "warm", researcher)
    page = researcher_client.get(reverse("run-launch"), {"evaluate": "warm"})
    form = page.context["form"]
    assert form["mode"].value() == "bench" and form["buffer.eval_taskset"].value() is None
    assert form["name"].value() == "eval warm"
    assert "which had no eval taskset: pick buffer.eval_taskset" in page.content.decode()
    refused = researcher_client.post(reverse("run-launch"), launch_fields(form))
    assert refused.status_code == 200 and "required by mode &#x27;bench&#x27;" in str(
        refused.context["form"]["buffer.eval_taskset"].errors)
    assert list(Run.objects.values_list("pk", flat=True)) == [source.pk]

    source.delete()
    page = researcher_client.get(reverse("run-launch"), {"evaluate": "warm"})
    assert page.context["form"]["mode"].value() == "bench"
    assert page.context["form"]["model.path"].value() == "models/warm"
    assert "Run <bdi>warm up</bdi>, which it was saved from, is deleted" in page.content.decode()
    stale = researcher_client.get(reverse("run-launch"), {"evaluate": "gone"})
    assert stale.context["form"]["model.path"].value() == ""
    assert "No saved model named <bdi>gone</bdi> (deleted?)" in stale.content.decode()


def test_the_models_page_is_a_leaderboard_of_eval_scores_sorted_by_one_each_linked_to_its_run(
        researcher_client, client, source, researcher, make_run):
    warm = services.save_model(source, 5, "warm", researcher)
    best = services.save_model(source, 5, "best", researcher)
    later = run_dir(source) / "checkpoints" / "step_6"  # a step the run did not evaluate at
    shutil.copytree(run_dir(source) / "checkpoints" / "step_5", later)
    Checkpoint.objects.create(run=source, version=6, step=6, path=str(later))
    never = services.save_model(source, 6, "never", researcher)
    record_metrics(source, "eval", 5, {"exact_match": 0.5, "reward_mean": 0.5})  # the source's at save
    record_metrics(source, "eval", 10, {"exact_match": 0.9})  # a later step: not the checkpoint's
    older = bench_run(make_run, warm, "sums-eval", exact_match=0.6, reward_mean=0.6)
    newer = bench_run(make_run, warm, "sums-eval", name="bench again", exact_match=0.75, reward_mean=0.75)
    other = bench_run(make_run, warm, "words-eval", reward_mean=0.25)  # no accuracy: its reward
    top = bench_run(make_run, best, "sums-eval", exact_match=0.875)
    running = bench_run(make_run, never, "sums-eval", status=Run.Status.RUNNING, exact_match=1.0)  # not finished
    bench_run(make_run, never, "sums-eval", status=Run.Status.FAILED, exact_match=1.0)

    page = researcher_client.get(reverse("model-list"), {"sort": "sums-eval"})
    html = page.content.decode()
    assert [model.name for model in page.context["models"]] == ["best", "warm", "never"]
    assert page.context["tasksets"] == ["sums-eval", "words-eval"]
    row = html.split('id="model-warm"')[1].split("</tr>")[0]
    assert f'href="{reverse("run-detail", args=[newer.pk])}" title="exact_match of run \u2068bench again\u2069 ' \
           '(bench)">0.750</a>' in row
    assert f'"score-value" href="{reverse("run-detail", args=[older.pk])}"' not in row  # the newest bench run's
    assert f'at save <a href="{reverse("run-detail", args=[source.pk])}"' in row and ">0.500</a>" in row
    assert f'"score-value" href="{reverse("run-detail", args=[other.pk])}"' in row and ">0.250</a>" in row
    assert '<span class="muted small">reward</span>' in row
    never_row = html.split('id="model-never"')[1].split("</tr>")[0]
    # Its running bench run shows in its cell (tests/apps/saved_models/test_pending_bench.py), scoring nothing yet.
    assert "Not evaluated yet" not in never_row and f'{reverse("run-launch")}?evaluate=never' in never_row
    assert f'href="{reverse("run-detail", args=[running.pk])}"' in never_row
    assert ">1.000<" not in never_row  # a running or failed bench run scores nothing
    best_row = html.split('id="model-best"')[1].split("</tr>")[0]
    assert f'"score-value" href="{reverse("run-detail", args=[top.pk])}"' in best_row
    assert [model.name for model in researcher_client.get(reverse("model-list"),
                                                          {"sort": "words-eval"}).context["models"]] == [
        "warm", "never", "best"]  # the unscored in the order saved, newest first
    unknown = researcher_client.get(reverse("model-list"), {"sort": "nope"})
    assert [model.name for model in unknown.context["models"]] == ["never", "best", "warm"]
    assert "No model has a score on <bdi>nope</bdi> to sort by" in unknown.content.decode()

    listed = client.get(reverse("api-models"), HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").json()
    scores = {model["name"]: model["scores"] for model in listed["results"]}
    assert scores["warm"] == [
        {"eval_taskset": "words-eval", "metric": "reward_mean", "value": 0.25, "run": other.pk,
         "run_name": other.name, "step": 0, "source": "bench"},
        {"eval_taskset": "sums-eval", "metric": "exact_match", "value": 0.75, "run": newer.pk,
         "run_name": "bench again", "step": 0, "source": "bench"},
        {"eval_taskset": "sums-eval", "metric": "exact_match", "value": 0.6, "run": older.pk,
         "run_name": older.name, "step": 0, "source": "bench"},
        {"eval_taskset": "sums-eval", "metric": "exact_match", "value": 0.5, "run": source.pk,
         "run_name": "warm up", "step": 5, "source": "at save"}]
    assert scores["never"] == [] and [score["value"] for score in scores["best"]] == [0.875, 0.5]
    assert {model["evaluate_url"] for model in listed["results"]} == {
        f"{reverse('run-launch')}?evaluate={name}" for name in ("warm", "best", "never")}


def test_trained_from_it_says_how_each_run_uses_the_model_and_its_status(
        researcher_client, client, source, researcher, make_run):
    saved = services.save_model(source, 5, "warm", researcher)
    directory = str(services.model_dir(saved))
    uses = {"policy": ({"model": {"path": directory}}, Run.Status.RUNNING),
            "ref and critic": ({"model": {"path": "tiny", "ref_path": directory, "critic_path": directory}},
                               Run.Status.QUEUED),
            "judge": ({"explorer": {"reward_fn": {"reward_model": {"model": directory}}}}, Run.Status.COMPLETED),
            "bench": ({"mode": "bench", "model": {"path": directory}}, Run.Status.FAILED)}
    runs = {name: make_run(name, status=status, config=config) for name, (config, status) in uses.items()}
    row = researcher_client.get(reverse("model-list")).content.decode().split('id="model-warm"')[1].split("</tr>")[0]
    for name, said, status in [("policy", "policy", "running"), ("ref and critic", "reference, critic", "queued"),
                               ("judge", "reward model", "completed"), ("bench", "evaluated", "failed")]:
        assert (f'{name}</bdi></a>\n          <span class="muted small">{said}</span> '
                f'<span class="status {status}">{status}</span>') in row, name
    listed = client.get(reverse("api-models"), HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}").json()
    assert listed["results"][0]["runs"] == [
        {"run": runs["policy"].pk, "name": "policy", "status": "running", "uses": ["policy"]},
        {"run": runs["ref and critic"].pk, "name": "ref and critic", "status": "queued",
         "uses": ["reference", "critic"]},
        {"run": runs["judge"].pk, "name": "judge", "status": "completed", "uses": ["reward model"]},
        {"run": runs["bench"].pk, "name": "bench", "status": "failed", "uses": ["evaluated"]}]


def test_only_researchers_see_scores_and_evaluate_on_the_page_the_api_and_the_launch_form(
        source, researcher, annotator, make_run):
    saved = services.save_model(source, 5, "warm", researcher)
    bench_run(make_run, saved, "sums-eval", exact_match=0.75)
    watcher = Client()
    watcher.force_login(annotator)
    assert watcher.get(reverse("model-list")).status_code == 403
    assert watcher.get(reverse("run-launch"), {"evaluate": "warm"}).status_code == 403
    refused = watcher.get(reverse("api-models"), HTTP_AUTHORIZATION=f"Bearer {token_for(annotator)}")
    assert refused.status_code == 403 and "scores" not in json.dumps(refused.json())
    allowed = Client()
    allowed.force_login(researcher)
    page = allowed.get(reverse("model-list")).content.decode()
    assert ">0.750</a>" in page and f'{reverse("run-launch")}?evaluate=warm' in page
    assert allowed.get(reverse("run-launch"), {"evaluate": "warm"}).context["form"]["mode"].value() == "bench"
