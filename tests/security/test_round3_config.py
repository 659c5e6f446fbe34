"""Hostile run configs, round 3 (issue #30): findings 1 (the launch form's own fields), 4 (reward
models outside the model directories), 5 (reward fn parameters), 6 (scale keys), 10 (NUL and lone
surrogates through configs and the API) and 12 (the calculator tool).

Every config text is read by one reader (workers.rft.config.parse_config_text) and is a bounded
JSON value before anything renders, dumps or stores it; reward fns declare their parameters and
are checked with the rest of the config; every model path is confined as model.path is."""
import json
import shutil
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from apps.buffer.curation import start_rescore
from apps.buffer.forms import RescoreForm
from apps.buffer.models import Experience
from apps.runs.api import token_for
from apps.runs.forms import LaunchForm
from apps.runs.models import Run
from tests.security.test_bad_configs import GOOD, merged, model_dir
from tests.security.test_hostile_configs import nested
from tests.support import api_launcher, browser_client, taskset_with_a_task
from workers.rft.config import MAX_CONFIG_CHARS, MAX_CONFIG_DEPTH, ConfigError

LAUNCH = reverse("run-launch")


@pytest.fixture
def arith(db):
    return taskset_with_a_task("arith")


@pytest.fixture
def api(researcher, arith):
    return api_launcher(researcher, "hostile")


@pytest.fixture
def page(researcher, arith):
    """The launch page as a browser posts it, answering 500s instead of raising them."""
    return browser_client(researcher)


def refusal(response) -> dict[str, str]:
    """{key: message} of a JSON 400."""
    assert response.status_code == 400, response.content[:500]
    assert response["Content-Type"] == "application/json"
    return {error["key"]: error["message"] for error in response.json()["errors"]}


def form_fields(config=GOOD, **changes) -> dict:
    """The form editor's POST for config, as the page fills it in, with changes."""
    initial = LaunchForm.for_config(config).initial
    fields = {key: value for key, value in initial.items() if value is not None and value is not False}
    return {**fields, "name": "hostile", "editor": "form", **changes}


def form_errors(response) -> str:
    assert response.status_code == 200, response.content[:300]
    return str(response.context["form"].errors)


def alias_chain(levels: int) -> str:
    """The issue's reward_fn: &a0 [10 x "lol"], &a1 [10 x *a0], ...: each level x10."""
    items = ["&a0 [" + ", ".join(['"lol"'] * 10) + "]"]
    items += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "{exact_match: {x: [" + ", ".join(items) + "]}}"


# ---- finding 1: the launch form's reward_fn and hidden base fields -------------------------------


def test_switching_editors_carries_a_good_config_over(page):
    """The control: a good config switches both ways and launches."""
    to_yaml = page.post(LAUNCH, form_fields(**{"explorer.reward_fn": "{exact_match: 1, format: 0.2}", "switch": "1"}))
    form = to_yaml.context["form"]
    assert form.current_editor == "yaml" and "format: 0.2" in form.initial["yaml"]
    back = page.post(LAUNCH, {"name": "ok", "editor": "yaml", "yaml": form.initial["yaml"], "switch": "1"})
    assert back.context["form"].initial["explorer.reward_fn"] == {"exact_match": 1, "format": 0.2}
    assert page.post(LAUNCH, {"name": "ok", "editor": "yaml", "yaml": form.initial["yaml"]}).status_code == 302


def test_an_alias_chain_in_the_reward_fn_field_is_refused_not_expanded(page):
    """The issue's 7 levels made a 191 MB page in 18 s; 4 are enough to show the refusal."""
    started = time.perf_counter()
    response = page.post(LAUNCH, form_fields(**{"explorer.reward_fn": alias_chain(4), "switch": "1"}))
    assert "anchors and aliases (&amp;a0, *a0) are not accepted" in form_errors(response)
    assert len(response.content) < 100_000 and time.perf_counter() - started < 2


def test_a_deep_reward_fn_field_is_a_form_error(page):
    response = page.post(LAUNCH, form_fields(**{"explorer.reward_fn": "{a: " + "[" * 2000 + "]" * 2000 + "}"}))
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep" in form_errors(response)
    assert not Run.objects.exists()


def test_a_deep_base_field_with_switch_is_a_form_error(page):
    response = page.post(LAUNCH, form_fields(base=json.dumps({**GOOD, "x": nested(400)}), switch="1"))
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep" in form_errors(response)


def test_a_huge_base_field_is_refused_before_it_is_read(page):
    huge = json.dumps({**GOOD, "x": [{"k": i} for i in range(100_000)]})  # 1.2 MB, the size
    assert len(huge) > 1_000_000
    started = time.perf_counter()
    response = page.post(LAUNCH, form_fields(base=huge, switch="1"))
    assert f"at most {MAX_CONFIG_CHARS}" in form_errors(response)
    assert time.perf_counter() - started < 2  # the issue: 5 s of CPU


def test_a_base_that_is_fine_alone_but_too_big_with_the_fields_is_refused(page):
    """Each part is bounded as it is read; what the form puts together is bounded again."""
    base = json.dumps({**GOOD, "explorer": {**GOOD["explorer"], "system_prompt": "x" * (MAX_CONFIG_CHARS - 1000)}})
    reward_fn = "{exact_match: {x: '" + "y" * 2000 + "'}}"
    response = page.post(LAUNCH, form_fields(base=base, switch="1", **{"explorer.reward_fn": reward_fn}))
    assert f"more than {MAX_CONFIG_CHARS} characters long" in form_errors(response)


def test_a_reward_fn_problem_shows_by_the_reward_fn_field(page):
    response = page.post(LAUNCH, form_fields(**{"explorer.reward_fn": "{numeric: {tol: 1}}"}))
    assert response.status_code == 200
    said = response.context["form"].errors["explorer.reward_fn"]
    assert said == ["numeric.tol: unknown key; known keys: weight, tolerance"]


# ---- finding 4: every model path is confined, reward fns' and rescores' too ----------------------


@pytest.fixture
def models_root(settings, tmp_path):
    """A folder for model directories inside the data dir, removed afterwards."""
    root = settings.DATA_DIR / f"models-test-{tmp_path.name}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def outside_model(tmp_path):
    """A real model directory, outside the data dir and RFTWEB_MODEL_DIRS."""
    return str(model_dir(tmp_path, "judge"))


REWARD_MODEL_SPECS = {
    "llm_judge": lambda path: {"llm_judge": {"model": path}},
    "reward_model": lambda path: {"reward_model": {"model": path, "weight": 0.5}},
}


def test_model_path_with_that_directory_is_refused(api, outside_model):
    """The control: as model.path, the same directory was refused already."""
    assert "outside the allowed model directories" in refusal(api(merged(GOOD, {"model": {"path": outside_model}})))[
        "model.path"
    ]


@pytest.mark.parametrize("name", REWARD_MODEL_SPECS)
def test_a_reward_fns_model_outside_the_model_directories_is_refused(api, outside_model, name):
    errors = refusal(api(merged(GOOD, {"explorer": {"reward_fn": REWARD_MODEL_SPECS[name](outside_model)}})))
    assert "outside the allowed model directories" in errors[f"explorer.reward_fn.{name}.model"]
    assert not Run.objects.exists()


def test_a_rescore_with_a_model_outside_is_refused(outside_model, db):
    text = json.dumps({"llm_judge": {"model": outside_model}})
    form = RescoreForm({"reward_fn": text})
    assert not form.is_valid()
    assert "reward_fn.llm_judge.model: " in form.errors["reward_fn"][0]
    assert "outside the allowed model directories" in form.errors["reward_fn"][0]
    with pytest.raises(ConfigError, match="outside the allowed model directories"):
        start_rescore(Experience.objects.none(), reward_fn={"llm_judge": {"model": outside_model}})


def test_the_answer_does_not_say_whether_a_path_outside_exists(api):
    """`model: /etc/passwd` was a file-existence oracle: the run's error said what was there."""
    def said(path):
        message = refusal(api(merged(GOOD, {"explorer": {"reward_fn": {"llm_judge": {"model": path}}}})))[
            "explorer.reward_fn.llm_judge.model"
        ]
        return message.replace(repr(path), "<path>")

    assert said("/etc/passwd") == said("/etc/no-such-file-here") == said("/etc")
    assert not Run.objects.exists()


def test_a_reward_model_inside_the_data_dir_is_stored_resolved(api, settings, models_root):
    """The workers read exactly what was checked: a relative path is taken from the data dir at
    launch, and would be taken from the worker's working directory if stored as written."""
    judge = model_dir(models_root, "judge")
    relative = str(judge.relative_to(settings.DATA_DIR))
    response = api(merged(GOOD, {"explorer": {"reward_fn": {"llm_judge": {"model": relative, "weight": 2}}}}))
    assert response.status_code == 201, response.content
    stored = Run.objects.get().config["explorer"]["reward_fn"]
    assert stored == {"llm_judge": {"model": str(judge.resolve()), "weight": 2}}


# ---- finding 5: reward fn parameters have a schema -------------------------------------------------

JUDGE = "explorer.reward_fn.llm_judge"
BAD_JUDGE_PARAMS = {
    "max-new-tokens-1e9": ({"max_new_tokens": 10**9}, "max_new_tokens", "must be <= 1024"),
    "max-new-tokens-float": ({"max_new_tokens": 1e9}, "max_new_tokens", "expected an integer"),
    "padding-format-spec": ({"rubric": "{response:>50000000}"}, "rubric", "takes no format spec"),
    "attribute-lookup": ({"rubric": "{response.__class__.__init__.__globals__}"}, "rubric", "is not a placeholder"),
    "unknown-placeholder": ({"rubric": "{nope} {response}"}, "rubric", "{nope} is not a placeholder"),
    "response-copies": ({"rubric": "{response}" * 400}, "rubric", "{response} may appear once"),
    "no-response": ({"rubric": "Rate it."}, "rubric", "must contain {response}"),
    "batch-size-0": ({"batch_size": 0}, "batch_size", "must be >= 1"),
    "max-score-0": ({"max_score": 0}, "max_score", "must be > 0"),
    "device-meta": ({"device": "meta"}, "device", "'meta' is not one of: auto, cpu, cuda"),
    "unknown-param": ({"temperature": 0.5}, "temperature", "unknown key"),
}


@pytest.mark.parametrize("params, param, words", BAD_JUDGE_PARAMS.values(), ids=BAD_JUDGE_PARAMS.keys())
def test_bad_judge_parameters_are_refused_at_launch(api, params, param, words):
    errors = refusal(api(merged(GOOD, {"explorer": {"reward_fn": {"llm_judge": {"model": "tiny", **params}}}})))
    assert words in errors[f"{JUDGE}.{param}"], errors
    assert not Run.objects.exists()


def test_good_judge_parameters_launch(api):
    params = {"model": "tiny", "max_new_tokens": 8, "batch_size": 4, "max_score": 5, "device": "cpu",
              "rubric": "Score 0-{max_score}: {prompt} / {answer} / {response}. Out of {max_score}: {{Score: n}}"}
    assert api(merged(GOOD, {"explorer": {"reward_fn": {"llm_judge": params}}})).status_code == 201


@pytest.mark.parametrize("spec, key, words", [
    ({"reward_model": {"model": "tiny", "batch_size": 10**6}}, "explorer.reward_fn.reward_model.batch_size", "<= 256"),
    ({"reward_model": {"model": "tiny", "device": "meta"}}, "explorer.reward_fn.reward_model.device", "not one of"),
    ({"reward_model": {}}, "explorer.reward_fn.reward_model.model", "required"),
    ({"numeric": {"tolerance": "big"}}, "explorer.reward_fn.numeric.tolerance", "expected a number"),
    ({"format": {"think": "yes"}}, "explorer.reward_fn.format.think", "expected a boolean"),
    ({"countdown": {"use_all": 1}}, "explorer.reward_fn.countdown.use_all", "expected a boolean"),
])
def test_every_reward_fn_checks_its_parameters(api, spec, key, words):
    assert words in refusal(api(merged(GOOD, {"explorer": {"reward_fn": spec}})))[key]


def test_a_rescore_checks_the_parameters_too(db):
    form = RescoreForm({"reward_fn": "{llm_judge: {model: tiny, max_new_tokens: 1000000000}}"})
    assert not form.is_valid()
    assert form.errors["reward_fn"] == ["reward_fn.llm_judge.max_new_tokens: must be <= 1024, got 1000000000"]


# ---- finding 6: scale keys have sane upper bounds ---------------------------------------------------

SCALE = {
    "engine-num-256": ({"explorer": {"engine_num": 256}, "synchronizer": {"method": "checkpoint"}},
                       "explorer.engine_num", "must be <= 32"),
    "processes-64": ({"trainer": {"strategy": "ddp", "num_processes": 64}}, "trainer.num_processes", "<= 16"),
    "nodes-1000": ({"trainer": {"strategy": "ddp", "num_nodes": 1000}}, "trainer.num_nodes", "must be <= 32"),
    "keep-checkpoints-1000": ({"trainer": {"keep_checkpoints": 1000}}, "trainer.keep_checkpoints", "<= 50"),
    "lora-r-4096": ({"model": {"lora": {"r": 4096}}}, "model.lora.r", "must be <= 1024"),
}


@pytest.mark.parametrize("patch, key, words", SCALE.values(), ids=SCALE.keys())
def test_scale_keys_are_bounded(api, patch, key, words):
    assert words in refusal(api(merged(GOOD, patch)))[key]


def test_lora_rank_is_at_most_the_models_hidden_size(api, models_root):
    small = str(model_dir(models_root, "small", config={
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
    }))
    lora = {"model": {"path": small, "lora": {"r": 128}}}
    assert refusal(api(merged(GOOD, lora)))["model.lora.r"] == "must be at most the model's hidden size (64), got 128"
    assert api(merged(GOOD, merged(lora, {"model": {"lora": {"r": 64}}}))).status_code == 201


def test_a_train_run_of_an_algorithm_that_trains_on_rollouts_is_refused(api):
    """A run reads its own buffer: in mode train it has no rollouts, and skipped every step."""
    assert "'train' rolls nothing out, and algorithm 'grpo' trains on rollouts" in refusal(
        api(merged(GOOD, {"mode": "train"})))["mode"]
    sft = {"mode": "train", "algorithm": {"name": "sft", "repeat_times": 1}, "buffer": {"expert_taskset": "arith"}}
    assert api(merged(GOOD, sft)).status_code == 201


def test_lora_targets_are_modules_of_the_model(api, models_root):
    """A typo ('qproj') validated, then failed the run in peft with an error naming no config key."""
    small = str(model_dir(models_root, "small-qwen", config={
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    }))
    typo = {"model": {"path": small, "lora": {"target_modules": ["q_proj", "qproj"]}}}
    assert refusal(api(merged(GOOD, typo)))["model.lora.target_modules"] == (
        "no module of the model is named 'qproj': its linear layers are down_proj, gate_proj, k_proj, lm_head, "
        "o_proj, q_proj, up_proj, v_proj")
    suffixes = {"model": {"path": small, "lora": {"target_modules": ["self_attn.q_proj", "down_proj"]}}}
    assert api(merged(GOOD, suffixes)).status_code == 201


def test_a_rollout_longer_than_the_models_positions_is_refused(api, models_root):
    """vLLM's context was min(positions, 2,048) whatever the config said: it cut answers short and
    refused long prompts mid-run. The config is now checked against the model's positions."""
    short = str(model_dir(models_root, "short", config={
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 512,
    }))
    longer = {"model": {"path": short, "max_prompt_tokens": 400}, "explorer": {"max_new_tokens": 200}}
    assert refusal(api(merged(GOOD, longer)))["explorer.max_new_tokens"] == (
        "a rollout may hold 600 tokens (model.max_prompt_tokens + explorer.max_new_tokens), past the model's 512 "
        "positions (max_position_embeddings in its config.json)")
    frozenlake = {"env": "frozenlake", "max_tokens": 1024}
    episodes = {"model": {"path": short}, "explorer": {"workflow": "multi_turn", "workflow_args": frozenlake}}
    assert "a rollout may hold 1,024 tokens (explorer.workflow_args.max_tokens)" in refusal(
        api(merged(GOOD, episodes)))["explorer.workflow_args.max_tokens"]
    fits = {"model": {"path": short, "max_prompt_tokens": 256}, "explorer": {"max_new_tokens": 256}}
    assert api(merged(GOOD, fits)).status_code == 201


# ---- finding 10: NUL and lone surrogates: a 400 naming the key --------------------------------------

UNSTORABLE = {
    "surrogate-in-a-string": ({"explorer": {"system_prompt": "a\ud800b"}}, "explorer.system_prompt", "lone surrogate"),
    "surrogate-in-a-list": ({"explorer": {"pipeline": ["\udfff"]}}, "explorer.pipeline[0]", "lone surrogate"),
    "surrogate-in-a-reward-param": ({"explorer": {"reward_fn": {"llm_judge": {"model": "tiny", "rubric": "\ud800"}}}},
                                    "explorer.reward_fn.llm_judge.rubric", "lone surrogate"),
    "surrogate-in-a-model-path": ({"model": {"path": "models/\ud800"}}, "model.path", "lone surrogate"),
    "surrogate-in-a-key": ({"feedback": {"\ud800": 1}}, "feedback", "has a key '\\ud800' that must not contain"),
    "nul-in-a-taskset-name": ({"buffer": {"taskset": "ar\x00ith"}}, "buffer.taskset", "NUL character"),
}


@pytest.mark.parametrize("patch, key, words", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_unstorable_text_in_a_config_is_a_400_naming_the_key(api, patch, key, words):
    assert words in refusal(api(merged(GOOD, patch)))[key]
    assert not Run.objects.exists()


@pytest.mark.parametrize("name", ["a\ud800", "a\x00b"])
def test_an_unstorable_run_name_is_a_400_naming_the_key(api, name):
    assert set(refusal(api(GOOD, name=name))) == {"name"}
    assert not Run.objects.exists()


def test_a_surrogate_written_as_a_yaml_escape_is_a_form_error(page):
    """The YAML editor's text can carry one as an escape ("\\ud800"), which the page cannot show."""
    text = "buffer: {taskset: arith}\nexplorer: {system_prompt: \"\\ud800\"}\n"
    response = page.post(LAUNCH, {"name": "x", "editor": "yaml", "yaml": text})
    # libyaml (config.parse_config_text) refuses the escape while reading, naming where it is.
    errors = form_errors(response)
    assert "found invalid Unicode character escape code" in errors and "line 2, column 30" in errors, errors
    assert not Run.objects.exists()


@pytest.mark.parametrize("query, words", [
    ("role=%00", "role"), ("role=x", "role must be one of"), ("since=%C2%B2", "since must be"),
])
def test_bad_metric_filters_are_json_400s(researcher, arith, query, words):
    """(A NUL in any query parameter may be refused before the view: rftweb's middleware.)"""
    run = Run.objects.create(name="r", owner=researcher, config=GOOD)
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    response = client.get(f"/api/runs/{run.pk}/metrics/?{query}")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert words in response.json()["error"]


# ---- finding 12: the calculator bounds every intermediate result ------------------------------------


def test_the_calculator_refuses_a_tower_of_powers_at_once():
    """(((9**99)**99)**99)**99 ran past 60 s: only the exponent was checked. In a child process, so
    that the old behaviour fails the test by its timeout instead of hanging it."""
    code = (
        "from workers.rft.tools import ToolError, call\n"
        "try:\n    call('calculator', {'expression': '(((9**99)**99)**99)**99'})\n"
        "except ToolError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert "more than 4096 bits" in done.stdout, done.stderr


# ---- the CLI reads the same way ------------------------------------------------------------------


def test_the_cli_refuses_a_name_that_is_not_text(researcher, arith, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(GOOD))
    with pytest.raises(CommandError, match="the run name must not contain a lone surrogate"):
        call_command("rft_run", str(path), "--owner", researcher.username, "--name", "a\udcff")  # argv byte 0xff
    assert not Run.objects.exists()


def test_the_cli_refuses_a_reward_model_outside(researcher, arith, tmp_path, outside_model):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(merged(GOOD, {"explorer": {"reward_fn": {"llm_judge": {"model": outside_model}}}})))
    with pytest.raises(CommandError, match="explorer.reward_fn.llm_judge.model: .* lies outside"):
        call_command("rft_run", str(path), "--owner", researcher.username)
    assert not Run.objects.exists()


def test_a_deep_pipeline_operator_parameter_is_a_form_error(db):
    """The buffer's other spec, an operator's parameters, is read the same way (1,000 `[` in its 2,000
    characters were a RecursionError: a 500)."""
    from apps.buffer.forms import PipelineForm

    form = PipelineForm({"operator": "dedupe", "params": '{"a": ' + "[" * 990 + "]" * 990 + "}"})
    assert not form.is_valid()
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep" in form.errors["params"][0]
