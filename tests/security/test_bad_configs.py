"""Bad run configs and model directories, through the JSON API, the launch form and the CLI:
each is refused with an error naming the key, and nothing is created."""
import json
import shutil
import uuid

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Run
from tests.support import taskset_with_a_task

GOOD = {
    "model": {"path": "tiny"},
    "algorithm": {"name": "grpo", "repeat_times": 2},
    "explorer": {"batch_size": 2, "max_new_tokens": 8},
    "trainer": {"total_steps": 2},
    "buffer": {"taskset": "arith"},
}


def merged(base: dict, patch: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture
def api(researcher):
    taskset_with_a_task("arith")
    client = Client(enforce_csrf_checks=True)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token_for(researcher)}"}

    def post(body, content_type="application/json"):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return client.post(reverse("api-runs"), data, content_type=content_type, **headers)

    return post


def refused(response, key: str) -> bool:
    body = response.json()
    return response.status_code == 400 and key in {e["key"] for e in body.get("errors", [])}


def test_the_good_config_launches(api):
    """The control: the corpus below breaks one thing at a time in a config that works."""
    response = api({"name": "ok", "config": GOOD})
    assert response.status_code == 201, response.content
    assert Run.objects.count() == 1


CONFIG_CASES = {
    # YAML text
    "yaml-syntax": ("model: [unclosed\ntrainer: {", "<config>"),
    "yaml-not-a-mapping": ("- a\n- b\n", "<config>"),
    "yaml-tabs": ("model:\n\tpath: tiny\n", "<config>"),
    # unknown keys
    "unknown-section": ({"modle": {"path": "tiny"}}, "modle"),
    "unknown-nested-key": ({"trainer": {"learning_rate": 0.1}}, "trainer.learning_rate"),
    # wrong types
    "string-for-int": ({"explorer": {"batch_size": "16"}}, "explorer.batch_size"),
    "bool-for-int": ({"explorer": {"batch_size": True}}, "explorer.batch_size"),
    "list-for-section": ({"trainer": [1, 2]}, "trainer"),
    "null-for-number": ({"trainer": {"lr": None}}, "trainer.lr"),
    "float-for-int": ({"trainer": {"total_steps": 2.5}}, "trainer.total_steps"),
    "unknown-choice": ({"algorithm": {"name": "grpoo"}}, "algorithm.name"),
    "unknown-mode": ({"mode": "train_all"}, "mode"),
    # absurd values, low
    "batch-0": ({"explorer": {"batch_size": 0}}, "explorer.batch_size"),
    "lr-negative": ({"trainer": {"lr": -1}}, "trainer.lr"),
    "lr-nan": ("buffer: {taskset: arith}\ntrainer: {lr: .nan}\n", "trainer.lr"),
    "micro-batch-0": ({"trainer": {"micro_batch_size": 0}}, "trainer.micro_batch_size"),
    "seed-negative": ({"seed": -1}, "seed"),
    # absurd values, high (the launch's upper bounds)
    "tokens-1e9": ({"explorer": {"max_new_tokens": 10**9}}, "explorer.max_new_tokens"),
    "prompt-tokens-1e9": ({"model": {"max_prompt_tokens": 10**9}}, "model.max_prompt_tokens"),
    "steps-1e12": ({"trainer": {"total_steps": 10**12}}, "trainer.total_steps"),
    "repeat-1e6": ({"algorithm": {"repeat_times": 10**6}}, "algorithm.repeat_times"),
    "lr-5": ({"trainer": {"lr": 5.0}}, "trainer.lr"),
    "temperature-1e6": ({"explorer": {"temperature": 1e6}}, "explorer.temperature"),
    "seed-2-64": ({"seed": 2**64}, "seed"),
    "rollouts-per-step": ({"explorer": {"batch_size": 4096}, "algorithm": {"repeat_times": 64}}, "explorer.batch_size"),
    "system-prompt-200k": ({"explorer": {"system_prompt": "x" * 200_000}}, "explorer.system_prompt"),
    # what only the database knows
    "missing-taskset": ({"buffer": {"taskset": "nope"}}, "buffer.taskset"),
    # a trainer no data could reach (config_rules.data_issues): each ended "completed" at step 100 on nothing
    "dpo-train-no-pairs": ({"mode": "train", "algorithm": {"name": "dpo"}}, "feedback.source_runs"),
    "sft-train-no-expert-data": ({"mode": "train", "algorithm": {"name": "sft"}}, "buffer.expert_taskset"),
    "sft-edits-not-expert-data": ({"algorithm": {"name": "sft"}, "feedback": {"edits_as_expert": False}},
                                  "buffer.expert_taskset"),
    "grpo-train-no-rollouts": ({"mode": "train"}, "mode"),
    # a task selector and the params it declares (workers/rft/task_selectors.py)
    "unknown-task-selector": ({"buffer": {"task_selector": "curriculum"}}, "buffer.task_selector"),
    "task-selector-unknown-param": ({"buffer": {"task_selector": {"name": "difficulty_based", "m": 16}}},
                                    "buffer.task_selector.m"),
    "task-selector-tau-1e9": ({"buffer": {"task_selector": {"name": "difficulty_based", "tau": 1e9}}},
                              "buffer.task_selector.tau"),
    "task-selector-deep-value": ({"buffer": {"task_selector": {"name": "difficulty_based", "lamb": {"a": [1]}}}},
                                 "buffer.task_selector.lamb"),
}


def test_a_task_selector_with_its_params_launches_and_is_stored_as_given(api):
    selector = {"name": "difficulty_based", "target_reward": 0.4, "retire_after": 3}
    response = api({"name": "ok", "config": merged(GOOD, {"buffer": {"task_selector": selector}})})
    assert response.status_code == 201, response.content
    assert Run.objects.get().config["buffer"]["task_selector"] == selector


@pytest.mark.parametrize("config, key", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_bad_config_is_refused_with_its_key_and_nothing_is_created(api, config, key):
    response = api({"name": "bad", "config": config if isinstance(config, str) else merged(GOOD, config)})
    assert refused(response, key), response.content
    assert Run.objects.count() == 0


# ---- model directories --------------------------------------------------------------------------


@pytest.fixture
def models_root(settings):
    """A scratch folder under the data dir, removed afterwards."""
    root = settings.DATA_DIR / f"models-test-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def model_dir(root, name, *, config=None, files=("model.safetensors", "tokenizer.json", "chat_template.jinja")):
    directory = root / name
    directory.mkdir()
    if config is not False:
        if isinstance(config, str):
            text = config
        else:
            text = json.dumps(config or {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
        (directory / "config.json").write_text(text)
    for file in files:
        (directory / file).write_bytes(b"\0")
    return directory


def test_a_model_dir_inside_the_data_dir_launches_and_is_stored_resolved(api, models_root, settings):
    good = model_dir(models_root, "good")
    relative = str(good.relative_to(settings.DATA_DIR))
    response = api({"name": "ok", "config": merged(GOOD, {"model": {"path": relative}})})
    assert response.status_code == 201, response.content
    assert Run.objects.get().config["model"]["path"] == str(good.resolve())


MODEL_CASES = {
    "absolute-outside": (lambda root, tmp: "/etc", "outside the allowed model directories"),
    "relative-escape": (lambda root, tmp: "../../../../etc", "outside the allowed model directories"),
    "symlink-out": (lambda root, tmp: str((root / "link").symlink_to(tmp) or root / "link"), "outside the allowed"),
    "nul-byte": (lambda root, tmp: "models\x00/x", "NUL"),
    "missing-dir": (lambda root, tmp: str(root / "absent"), "no model directory"),
    "no-config-json": (lambda root, tmp: str(model_dir(root, "m", config=False)), "no config.json"),
    "config-not-json": (lambda root, tmp: str(model_dir(root, "m", config="{oops")), "not valid JSON"),
    "config-no-model-type": (lambda root, tmp: str(model_dir(root, "m", config={"hidden_size": 8})), "no model_type"),
    "wrong-architecture": (
        lambda root, tmp: str(
            model_dir(root, "m", config={"model_type": "bert", "architectures": ["BertForSequenceClassification"]})
        ),
        "not a causal language model",
    ),
    "no-weights": (lambda root, tmp: str(model_dir(root, "m", files=("tokenizer.json",))), "has no weights"),
    "no-tokenizer": (lambda root, tmp: str(model_dir(root, "m", files=("model.safetensors",))), "has no tokenizer"),
}


@pytest.mark.parametrize("key", ["model.path", "model.ref_path"])
@pytest.mark.parametrize("make_path, message", MODEL_CASES.values(), ids=MODEL_CASES.keys())
def test_bad_model_path_is_refused(api, models_root, tmp_path, settings, key, make_path, message):
    path = make_path(models_root, tmp_path)
    response = api({"name": "bad", "config": merged(GOOD, {"model": {key.split(".")[1]: path}})})
    assert refused(response, key), response.content
    said = next(e["message"] for e in response.json()["errors"] if e["key"] == key)
    assert message in said
    assert str(settings.DATA_DIR) not in said.replace(repr(path), "")  # the layout is private; the input is echoed
    assert Run.objects.count() == 0


def test_launch_form_shows_the_bound_next_to_its_field(researcher_client):
    taskset_with_a_task("arith")
    response = researcher_client.post(
        reverse("run-launch"),
        {
            "name": "huge",
            "editor": "yaml",
            "yaml": yaml.safe_dump(merged(GOOD, {"explorer": {"max_new_tokens": 10**9}})),
        },
    )
    assert response.status_code == 200 and Run.objects.count() == 0
    assert "must be &lt;= 32768" in response.content.decode() or "must be <= 32768" in response.content.decode()


@pytest.mark.parametrize("algorithm", ["dpo", "sft"])
def test_the_launches_that_trained_nothing_are_refused_by_the_api_and_the_form(api, researcher_client, algorithm):
    """As a reviewer sent them: no expert data, pairs or source runs, so 100 steps skipped."""
    taskset_with_a_task("addition")
    config = {"mode": "train", "algorithm": {"name": algorithm}, "buffer": {"taskset": "addition"}}
    response = api({"name": "nothing", "config": config})
    key = "feedback.source_runs" if algorithm == "dpo" else "buffer.expert_taskset"
    assert refused(response, key), response.content
    response = researcher_client.post(reverse("run-launch"), {"name": "nothing", "editor": "yaml",
                                                              "yaml": yaml.safe_dump(config)})
    assert response.status_code == 200 and f"{key}: required by algorithm" in " ".join(
        response.context["form"].errors["yaml"])
    assert Run.objects.count() == 0


def test_cli_refuses_a_bad_config_file(researcher, tmp_path):
    taskset_with_a_task("arith")
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(merged(GOOD, {"trainer": {"lr": -1}, "explorer": {"batch_size": 0}})))
    with pytest.raises(CommandError) as err:
        call_command("rft_run", str(path), "--owner", researcher.username)
    assert "trainer.lr" in str(err.value) and "explorer.batch_size" in str(err.value)
    assert Run.objects.count() == 0


def test_a_model_path_error_does_not_show_where_the_data_dir_is(api, settings):
    response = api({"name": "bad", "config": merged(GOOD, {"model": {"path": "models/absent"}})})
    said = next(e["message"] for e in response.json()["errors"] if e["key"] == "model.path")
    assert said == "no model directory at models/absent" and str(settings.DATA_DIR) not in said
