"""Refusals a launch adds to the engine's rules (config_rules.py) and what the launch form, sweeps and
presets do about them: a key nothing reads goes back to its default where the person did not set it
(a field the form hides, a sweep's base key a swept value leaves unread) and is refused where they
did; a trainer no data could reach; feedback source runs of another tokenizer or prompt format; a
model without a chat template."""
import json
import shutil

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from apps.runs import services, sweeps
from apps.runs.api import token_for
from apps.runs.models import Run
from apps.runs.presets import PRESETS, preset_config
from workers.rft.algorithms import ALGORITHMS
from workers.rft.config import ConfigError

from .test_launch import config_form, posted

URL = reverse("run-launch")


def api(user, config: dict):
    client = Client(enforce_csrf_checks=True)
    return client.post(reverse("api-runs"), json.dumps({"name": "api", "config": config}),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")


def refusal(error: ConfigError) -> dict[str, str]:
    return {issue.key: issue.message for issue in error.errors}


# ---- the launch form and the presets ----------------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_launches_from_the_form_as_it_opens(researcher_client, tasksets, worker_queue, name):
    form = researcher_client.get(URL, {"preset": name}).context["form"]
    response = researcher_client.post(URL, posted(form))
    assert response.status_code == 302, response.context["form"].errors
    assert Run.objects.get().config["algorithm"]["name"] == PRESETS[name].config["algorithm"]["name"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_quick_demo_launches_with_any_algorithm_picked(researcher_client, tasksets, worker_queue, algorithm):
    """The demo's expert taskset (mix reads it) is hidden for an algorithm that trains on no expert
    data, and launches at its default there: grpo on it was refused, and before that it did nothing."""
    response = researcher_client.post(URL, posted(config_form(), **{"algorithm.name": algorithm}))
    assert response.status_code == 302, response.context["form"].errors
    buffer = Run.objects.get().config["buffer"]
    reads_expert = algorithm in ("sft", "mix", "mix_chord")
    assert buffer["expert_taskset"] == ("addition" if reads_expert else None)


def test_a_field_the_page_shows_is_refused_by_it_naming_why(researcher_client, tasksets, worker_queue):
    response = researcher_client.post(URL, posted(config_form(), **{"algorithm.mix.expert_data_ratio": "0"}))
    (error,) = response.context["form"].errors["algorithm.mix.expert_data_ratio"]
    assert "0 puts no expert data" in error and not Run.objects.exists()


def test_the_same_key_in_yaml_is_refused_naming_it(researcher_client, tasksets, worker_queue):
    config = preset_config("quick-demo")
    config["algorithm"] = {"name": "grpo"}  # the demo's expert taskset kept, as typed
    response = researcher_client.post(URL, {"editor": "yaml", "yaml": yaml.safe_dump(config)})
    errors = " ".join(response.context["form"].errors["yaml"])
    assert "buffer.expert_taskset: has no effect with algorithm 'grpo'" in errors and not Run.objects.exists()


# ---- a trainer no data could reach (config_rules.data_issues) -------------------------------------------
# Each ran 100 steps of {"skipped": 1} and ended "completed", model v100, having trained nothing.
STARVED = {
    "dpo, mode train": ({"mode": "train", "algorithm": {"name": "dpo"}, "buffer": {"taskset": "addition"}},
                        "feedback.source_runs", "or buffer.expert_dataset"),
    "sft, mode train": ({"mode": "train", "algorithm": {"name": "sft"}, "buffer": {"taskset": "addition"}},
                        "buffer.expert_taskset", "or feedback.source_runs"),
    "sft, both, edits not expert data": ({"algorithm": {"name": "sft"}, "buffer": {"taskset": "addition"},
                                         "feedback": {"edits_as_expert": False}}, "buffer.expert_taskset",
                                        "feedback.edits_as_expert is false"),
    "grpo, mode train": ({"mode": "train", "buffer": {"taskset": "addition"}}, "mode", "'train' rolls nothing out"),
}


@pytest.mark.parametrize("config, key, words", STARVED.values(), ids=STARVED.keys())
def test_a_trainer_no_data_could_reach_is_refused_and_nothing_is_created(researcher, tasksets, worker_queue, config,
                                                                         key, words):
    with pytest.raises(ConfigError) as err:
        services.launch_run(researcher, "starved", config)
    assert list(refusal(err.value)) == [key] and words in refusal(err.value)[key]
    assert not Run.objects.exists() and worker_queue == []


def test_annotators_judging_the_runs_own_answers_feed_a_mode_both_sft_or_dpo(researcher, tasksets, worker_queue):
    """A human edit of a run's rollout is a human_edit row of that run, and a comparison of two is a
    preference on it: the run's buffer samples both (apps/buffer/store.py), so its trainer waits for them."""
    for algorithm in ("sft", "dpo"):
        services.launch_run(researcher, algorithm, {"algorithm": {"name": algorithm},
                                                    "buffer": {"taskset": "addition"}})
    assert Run.objects.count() == 2


def test_other_runs_judgements_or_imported_data_feed_a_mode_train_sft_or_dpo(researcher, tasksets, worker_queue):
    from apps.buffer.models import ExpertDataset

    ExpertDataset.objects.create(name="pairs", layout=ExpertDataset.Layout.DPO)
    demo = source_run(researcher)
    same = {"mode": "train", "model": {"path": "tiny"}, "explorer": {"use_chat_template": False},
            "buffer": {"taskset": "addition"}}
    for extra in ({"algorithm": {"name": "dpo"}, "feedback": {"source_runs": [demo.pk]}},
                  {"algorithm": {"name": "sft"}, "feedback": {"source_runs": [demo.pk]}},
                  {"algorithm": {"name": "dpo"}, "buffer": {"taskset": "addition", "expert_dataset": "pairs"}}):
        services.launch_run(researcher, "fed", {**same, **extra})
    assert Run.objects.filter(name="fed").count() == 3


def test_the_dpo_preset_turned_to_mode_train_on_the_form_says_what_to_fill_in(researcher_client, tasksets,
                                                                              worker_queue):
    form = researcher_client.get(URL, {"preset": "dpo-human"}).context["form"]
    assert form["mode"].value() == "both"  # as it opens, annotators judge its own answers: it launches (above)
    response = researcher_client.post(URL, posted(form, mode="train"))
    (error,) = response.context["form"].non_field_errors()  # a list: the YAML tab's key, named atop the form
    assert error.startswith("feedback.source_runs: required by algorithm 'dpo' in mode 'train'")
    assert "list the runs whose annotators' comparisons it trains on, or name imported pairs in " \
           "buffer.expert_dataset" in error
    assert not Run.objects.exists()


# ---- sweeps -------------------------------------------------------------------------------------------


def test_a_sweep_over_every_algorithm_leaves_out_the_data_each_does_not_read(researcher, tasksets, worker_queue):
    base = preset_config("quick-demo")
    space = [{"key": "algorithm.name", "values": list(ALGORITHMS)}]
    sweep = sweeps.launch_sweep(researcher, "every algorithm", base, space, "grid")
    experts = {run.config["algorithm"]["name"]: run.config["buffer"]["expert_taskset"] for run in sweep.runs.all()}
    assert experts == {name: "addition" if name in ("sft", "mix", "mix_chord") else None for name in ALGORITHMS}


def test_a_sweep_resets_what_a_reset_leaves_unread(researcher, tasksets, worker_queue):
    """sft reads no rollouts: rated_only goes back to false, and then so does the wait it allowed."""
    base = preset_config("quick-demo")
    base["feedback"] |= {"rated_only": True, "rating_wait_s": 30.0}
    sweep = sweeps.launch_sweep(researcher, "sft too", base, [{"key": "algorithm.name", "values": ["mix", "sft"]}],
                                "grid")
    mixed, sft = (run.config["feedback"] for run in sweep.runs.order_by("pk"))
    assert (mixed["rated_only"], mixed["rating_wait_s"]) == (True, 30.0)
    assert (sft["rated_only"], sft["rating_wait_s"]) == (False, 0.0)


def test_a_base_key_no_run_reads_is_the_bases_own_and_refused(researcher, tasksets, worker_queue):
    base = preset_config("smollm2-grpo")
    base["buffer"]["expert_taskset"] = "arithmetic"
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.launch_sweep(researcher, "lr", base, [{"key": "trainer.lr", "values": [1e-6, 3e-6]}], "grid")
    assert "buffer.expert_taskset" in {issue.key for issue in err.value.errors}
    assert not Run.objects.exists()


# ---- feedback source runs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir():
    """The built-in tiny model, in this test worker's data dir (rftweb.test_settings)."""
    from workers.rft.models import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture
def models_root(settings):
    root = settings.DATA_DIR / "models-config-test"
    root.mkdir(parents=True, exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def source_run(researcher, **explorer) -> Run:
    """A quick demo run on the tiny model, its config as launched."""
    config = preset_config("quick-demo")
    config["explorer"] |= explorer
    return Run.objects.create(name="demo", owner=researcher, config=services.validate_config(config).to_dict())


def dpo_on(source: Run, **changes) -> dict:
    config = preset_config("dpo-human")
    config["feedback"]["source_runs"] = [source.pk]
    for section, values in changes.items():
        config[section] |= values
    return config


def test_a_source_run_of_another_model_is_refused_naming_the_run(researcher, tasksets, tiny_dir):
    """The dpo-human preset after the quick demo: SmolLM2 (a 49,152-token vocabulary) was trained on
    the tiny model's token ids as they were, by the API and the form alike."""
    demo = source_run(researcher)
    config = dpo_on(demo, explorer={"use_chat_template": False})
    with pytest.raises(ConfigError) as err:
        services.validate_config(config)
    message = refusal(err.value)["feedback.source_runs"]
    assert f"run {demo.pk} ('demo')" in message and "'tiny'" in message and "'smollm2-135m'" in message
    response = api(researcher, config)
    assert response.status_code == 400 and "feedback.source_runs" in {e["key"] for e in response.json()["errors"]}
    assert Run.objects.count() == 1


def test_a_source_run_formatted_otherwise_is_refused(researcher, tasksets, tiny_dir):
    demo = source_run(researcher)  # no chat template, no system prompt
    for explorer, said in (({}, "its explorer.use_chat_template is false, this run's true"),
                           ({"use_chat_template": False, "system_prompt": "Be brief."}, "explorer.system_prompt")):
        with pytest.raises(ConfigError) as err:
            services.validate_config(dpo_on(demo, model={"path": "tiny"}, explorer=explorer))
        assert said in refusal(err.value)["feedback.source_runs"]


def test_a_source_run_of_the_same_tokenizer_and_format_is_accepted(researcher, tasksets, tiny_dir, models_root):
    """The same model by name, or by a directory of its own (a checkpoint of the demo's model has its
    tokenizer); a directory whose vocabulary has one token more is refused."""
    demo = source_run(researcher)
    same = {"use_chat_template": False, "system_prompt": None}  # the demo's prompt format
    services.validate_config(dpo_on(demo, model={"path": "tiny"}, explorer=same))
    copy = models_root / "tiny-checkpoint"
    shutil.copytree(tiny_dir, copy)
    services.validate_config(dpo_on(demo, model={"path": str(copy)}, explorer=same))
    other = models_root / "tiny-one-token-more"
    shutil.copytree(tiny_dir, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    size = max([*tokenizer["model"]["vocab"].values(), *(token["id"] for token in tokenizer["added_tokens"])]) + 1
    tokenizer["added_tokens"].append({"id": size, "content": "<|tool|>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError) as err:
        services.validate_config(dpo_on(demo, model={"path": str(other)}, explorer=same))
    assert f"have two tokenizers (vocabularies of {size:,} and {size + 1:,} tokens)" in refusal(err.value)[
        "feedback.source_runs"]


# ---- a model directory without a chat template ----------------------------------------------------------


def test_a_model_without_a_chat_template_is_refused_at_launch(researcher, tasksets, tiny_dir, models_root):
    """/tmp/wfaudit/notemplate.yaml: it validated, and failed at the run's first prompt ("Cannot use
    chat template functions because tokenizer.chat_template is not set")."""
    plain = models_root / "no-template"
    shutil.copytree(tiny_dir, plain)
    (plain / "chat_template.jinja").unlink()
    config = preset_config("smollm2-grpo")
    config["model"]["path"] = str(plain)
    with pytest.raises(ConfigError) as err:
        services.validate_config(config)
    assert list(refusal(err.value)) == ["explorer.use_chat_template"]
    assert "has no chat template" in refusal(err.value)["explorer.use_chat_template"]
    config["explorer"]["use_chat_template"] = False
    services.validate_config(config)
    # A template in tokenizer_config.json is one too.
    settings = json.loads((plain / "tokenizer_config.json").read_text())
    settings["chat_template"] = (tiny_dir / "chat_template.jinja").read_text()
    (plain / "tokenizer_config.json").write_text(json.dumps(settings))
    config["explorer"]["use_chat_template"] = True
    services.validate_config(config)
