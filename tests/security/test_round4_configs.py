"""Config cost and pipeline operators, round 4 (issue #41): findings 4 and 12.

4. A config costs what it is worth: YAML is read by libyaml, and its events are counted before
   anything is built (no anchor or alias, at most MAX_CONFIG_DEPTH deep, at most MAX_CONFIG_NODES
   nodes); a JSON config's nodes are counted before anything walks them; unknown keys past the
   reported ones get no difflib hint. The costliest 262,139-character texts (bench/config_cost.py;
   7.3 s of CPU each before, 0.02 s after) are held here to the work they may cause, counted in
   YAML events, nodes built and values walked, not in seconds.
12. Pipeline operators declare their params as reward fns do (pipelines.pipeline_operator): an
   unknown operator, an unknown param or a param of the wrong type or out of bounds is a 400
   naming its key (`explorer.pipeline[1].scale`), not a run that fails when it starts.
"""
import json
import threading
from pathlib import Path

import pytest
import yaml
from django.db import connection
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Run
from apps.runs.presets import PRESETS
from bench.config_cost import SIZE, worst_texts
from tests.security.test_bad_configs import GOOD, merged
from tests.security.test_round3_config import LAUNCH, form_errors, form_fields, refusal
from tests.support import api_launcher, browser_client, taskset_with_a_task
from workers.rft import config as config_module
from workers.rft import config_issues, config_text
from workers.rft.config import (
    MAX_CONFIG_CHARS,
    MAX_CONFIG_NODES,
    MAX_PIPELINE_OPERATORS,
    MAX_REPORTED_ISSUES,
    ConfigError,
    RunConfig,
    load_config,
    parse_config_text,
)
from workers.rft.pipelines import EXPERIENCE_OPERATORS, TASK_OPERATORS

WORST = worst_texts()
ACCEPTED = "yaml most nodes, accepted"
REFUSED = [shape for shape in WORST if shape != ACCEPTED]
TOO_MANY = f"more than {MAX_CONFIG_NODES} nodes"
EXAMPLES = Path(config_module.__file__).parent / "examples"


def nodes(value) -> int:
    """Mappings, lists, keys and scalars in value, as the config counts them."""
    if isinstance(value, dict):
        return 1 + len(value) + sum(nodes(child) for child in value.values())
    if isinstance(value, list):
        return 1 + sum(nodes(child) for child in value)
    return 1


class Work:
    """What reading and checking configs did: YAML events read before building, nodes built, the
    most nodes a bounded-value walk (json_value_problem) was given, difflib hints made."""

    def __init__(self):
        self.events = self.built = self.hints = 0
        self.walked = []


@pytest.fixture
def work(monkeypatch) -> Work:
    done = Work()
    loader = config_text._Loader
    get_event, construct_object = loader.get_event, loader.construct_object
    walk, hint = config_text.json_value_problem, config_issues.hint

    def counted_event(self):
        done.events += 1
        return get_event(self)

    def counted_build(self, node, deep=False):
        done.built += 1
        return construct_object(self, node, deep)

    def counted_walk(value, **limits):
        done.walked.append(nodes(value))
        return walk(value, **limits)

    def counted_hint(word, options):
        done.hints += 1
        return hint(word, options)

    monkeypatch.setattr(loader, "get_event", counted_event)
    monkeypatch.setattr(loader, "construct_object", counted_build)
    monkeypatch.setattr(config_text, "json_value_problem", counted_walk)
    monkeypatch.setattr(config_issues, "hint", counted_hint)
    return done


def refused_message(text: str) -> str:
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_dict(parse_config_text(text))
    return str(refused.value)


# ---- finding 4: what a config costs --------------------------------------------------------------


def test_yaml_is_read_by_libyaml():
    """PyYAML's pure-Python reader took 7.3 s for the deep lists below, libyaml 0.02 s (bench)."""
    assert yaml.__with_libyaml__, "PyYAML without libyaml: configs are read by the slow fallback"
    assert issubclass(config_text._Loader, yaml.CSafeLoader)


@pytest.mark.parametrize("shape", REFUSED)
def test_the_costliest_texts_are_refused_before_anything_is_built(work, shape):
    text = WORST[shape]
    assert len(text) == SIZE <= MAX_CONFIG_CHARS
    message = refused_message(text)
    assert TOO_MANY in message or "characters long as JSON" in message  # the long string: 262,139 + quotes
    assert work.built == (0 if TOO_MANY in message else 19)  # before: every node of the text, up to 260,000
    assert work.events <= 2 * MAX_CONFIG_NODES + 4  # a node is one or two events, and a stream's four
    assert all(walked <= MAX_CONFIG_NODES for walked in work.walked)


def test_the_most_nodes_a_config_may_have_are_read_and_one_more_is_refused(work):
    text = WORST[ACCEPTED]
    data = parse_config_text(text)
    assert nodes(data) == MAX_CONFIG_NODES and work.built == MAX_CONFIG_NODES
    assert len(RunConfig.from_dict(data).feedback.source_runs) == 9_977
    one_more = text.replace("source_runs: [", "source_runs: [1,", 1)
    assert f"line 5: {TOO_MANY}" in refused_message(one_more)
    as_json = json.dumps(yaml.safe_load(one_more))
    assert TOO_MANY in refused_message(as_json) and len(as_json) <= MAX_CONFIG_CHARS


def test_the_python_reader_is_bounded_the_same_way(monkeypatch):
    """Without libyaml the reader falls back to PyYAML's own: slower, and held to the same counts."""

    class PythonLoader(yaml.SafeLoader):
        events = 0

        def get_event(self):
            PythonLoader.events += 1
            return super().get_event()

    monkeypatch.setattr(config_text, "_Loader", PythonLoader)
    for text, words in [(WORST["yaml deep lists"], TOO_MANY), (WORST["yaml unknown keys"], TOO_MANY),
                        ("a: " + "[" * 50_000 + "]" * 50_000, "nested more than 64 levels deep"),
                        ("a: &x [1]\nb: *x\n", "anchors and aliases (&x, *x) are not accepted")]:
        PythonLoader.events = 0
        assert words in refused_message(text)
        assert PythonLoader.events <= 2 * MAX_CONFIG_NODES + 4
    assert parse_config_text("seed: 3\nexplorer: {pipeline: [dedupe]}") == {"seed": 3,
                                                                             "explorer": {"pipeline": ["dedupe"]}}


@pytest.mark.parametrize("config", [
    {f"k{i}": 1 for i in range(MAX_CONFIG_NODES // 2 - 1)},
    {"algorithm": {f"k{i}": 1 for i in range(MAX_CONFIG_NODES // 2 - 2)}},
    {"explorer": {"reward_fn": {f"k{i}": 1 for i in range(MAX_CONFIG_NODES // 2 - 3)}}},
    {"explorer": {"pipeline": [{"name": "reward_shaping", **{f"k{i}": 1 for i in range(150)}}] * 32}},
], ids=["top-level", "a section", "reward fns", "operator params"])
def test_only_the_reported_unknown_keys_get_a_hint(work, config):
    """difflib's closest name for each of 5,000 unknown keys: 0.13 s, for messages never shown."""
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_dict(config)
    assert len(refused.value.errors) == MAX_REPORTED_ISSUES + 1
    assert "did you mean" in str(refused.value) or "known" in str(refused.value)
    assert work.hints <= 2 * MAX_REPORTED_ISSUES  # before: one for each unknown key


@pytest.fixture
def arith(db):
    return taskset_with_a_task("arith")


@pytest.fixture
def api(researcher, arith):
    return api_launcher(researcher, "round4")


@pytest.fixture
def page(researcher, arith):
    return browser_client(researcher)


@pytest.mark.parametrize("shape", ["yaml deep lists", "json empty lists"])
def test_the_costliest_texts_are_400s_on_the_api(api, work, shape):
    errors = refusal(api(WORST[shape]))
    assert TOO_MANY in errors["<config>"]
    assert work.built == 0 and not Run.objects.exists()


def test_a_config_sent_as_a_json_object_is_counted_before_it_is_walked(api, work):
    errors = refusal(api(merged(GOOD, {"x": [[] for _ in range(50_000)]})))
    assert TOO_MANY in errors["<config>"]
    assert work.walked == [] and not Run.objects.exists()


def test_the_costliest_texts_are_form_errors_in_every_field_of_the_launch_page(page, work):
    """The YAML box, the hidden base field (JSON, as the page writes it) and the reward_fn field."""
    reward_fns = "{" + ",".join(f"k{i}: 1" for i in range(MAX_CONFIG_NODES)) + "}"
    posts = [
        {"name": "x", "editor": "yaml", "yaml": WORST["yaml deep lists"]},
        form_fields(base=WORST["json empty lists"], switch="1"),
        form_fields(**{"explorer.reward_fn": reward_fns}),
    ]
    for post in posts:
        assert TOO_MANY in form_errors(page.post(LAUNCH, post))
    assert work.built == 0 and not Run.objects.exists()


def test_four_at_once_through_the_api_each_cost_a_bounded_read(transactional_db, researcher, work):
    """The issue's four concurrent posts (41 s; the login page slowed to 1.4 s): each a 400, none built."""
    taskset_with_a_task("arith")
    token = token_for(researcher)
    answers = []

    def post():
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        body = json.dumps({"name": "four", "config": WORST["yaml deep lists"]})
        answers.append(client.post(reverse("api-runs"), body, content_type="application/json"))
        connection.close()  # this thread's own

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [TOO_MANY in refusal(answer)["<config>"] for answer in answers] == [True] * 4
    assert work.built == 0 and work.events <= 4 * (2 * MAX_CONFIG_NODES + 4)
    assert not Run.objects.exists()


# ---- finding 12: pipeline operators declare their params ---------------------------------------


# An algorithm that reads what every operator makes: expert data (promote_to_expert), and no group
# advantage that a filter before it would change (dedupe, reward_filter: config_rules._pipeline_rules).
READS_EVERY_OPERATOR = {"algorithm": {"name": "reinforce_plus_plus", "policy_loss": "mix"},
                        "buffer": {"expert_taskset": "arith"}}


def pipelines(experience=(), task=()) -> dict:
    return merged(merged(GOOD, READS_EVERY_OPERATOR),
                  {"explorer": {"pipeline": list(experience)}, "buffer": {"task_pipeline": list(task)}})


BAD_PIPELINES = {
    "unknown-name": (pipelines(["dedup"]), {"explorer.pipeline[0]": "unknown experience operator 'dedup'; "
                                                                     "did you mean 'dedupe'?"}),
    "unknown-name-in-a-mapping": (pipelines([{"name": "reward_shapin", "scale": 2}]), {
        "explorer.pipeline[0].name": "unknown experience operator 'reward_shapin'; did you mean 'reward_shaping'?"}),
    "unknown-name-far-off": (pipelines(task=["curriculum"]), {
        "buffer.task_pipeline[0]": "unknown task operator 'curriculum'; "
                                   "known: filter_difficulty, filter_length, priority, synthesize_harder"}),
    "wrong-type-and-unknown-param": (pipelines(["dedupe", {"name": "reward_shaping", "scale": "x", "sclae": 2}]), {
        "explorer.pipeline[1].scale": "expected a number, got a string",
        "explorer.pipeline[1].sclae": "unknown key; did you mean 'scale'?"}),
    "out-of-bounds": (pipelines([{"name": "reward_shaping", "length_penalty": -0.1}],
                                [{"name": "filter_length", "max_tokens": 0},
                                 {"name": "synthesize_harder", "max_new": 10**6}]), {
        "explorer.pipeline[0].length_penalty": "must be >= 0, got -0.1",
        "buffer.task_pipeline[0].max_tokens": "must be >= 1, got 0",
        "buffer.task_pipeline[1].max_new": "must be <= 1024, got 1000000"}),
    "params-of-an-operator-without-any": (pipelines([{"name": "dedupe", "min": 1}]), {
        "explorer.pipeline[0].min": "unknown key; known keys: none"}),
    "not-a-number": (pipelines([{"name": "reward_filter", "min": None, "max": True}]), {
        "explorer.pipeline[0].max": "expected a number, got a boolean"}),
    "too-many": (pipelines(["dedupe"] * (MAX_PIPELINE_OPERATORS + 1)), {
        "explorer.pipeline": f"at most {MAX_PIPELINE_OPERATORS} operators, got {MAX_PIPELINE_OPERATORS + 1}"}),
}


@pytest.mark.parametrize("config, expected", BAD_PIPELINES.values(), ids=BAD_PIPELINES.keys())
def test_bad_pipelines_are_refused_at_launch_naming_the_key(api, config, expected):
    assert refusal(api(config)) == expected  # before: 201, and the run failed as it started
    assert not Run.objects.exists()


def test_a_bad_operator_param_is_a_form_error_in_the_yaml_box(page):
    text = yaml.safe_dump(pipelines([{"name": "reward_shaping", "scale": "x"}]))
    errors = form_errors(page.post(LAUNCH, {"name": "x", "editor": "yaml", "yaml": text}))
    assert "explorer.pipeline[0].scale: expected a number, got a string" in errors
    assert not Run.objects.exists()


def test_every_operator_with_every_param_launches(api):
    experience = ["drop_empty", "drop_truncated", {"name": "reward_filter", "min": 0, "max": 1}, "group_std_filter",
                  "dedupe", {"name": "reward_shaping", "scale": 2, "offset": -1.5, "length_penalty": 0.01,
                             "truncation_penalty": 1}, {"name": "promote_to_expert", "min_reward": 1}]
    task = [{"name": "filter_length", "max_tokens": 128}, {"name": "filter_difficulty", "min": 0.1, "max": None},
            {"name": "priority", "difficulty": -1, "use_count": 0.5},
            {"name": "synthesize_harder", "min_reward": 0.9, "max_new": 8}]
    assert {op if isinstance(op, str) else op["name"] for op in experience} == set(EXPERIENCE_OPERATORS.names())
    assert {op["name"] for op in task} == set(TASK_OPERATORS.names())
    response = api(pipelines(experience, task))
    assert response.status_code == 201, response.content[:500]
    assert Run.objects.get().config["explorer"]["pipeline"] == experience


@pytest.mark.parametrize("registry", [EXPERIENCE_OPERATORS, TASK_OPERATORS], ids=lambda r: r.kind)
def test_every_operator_declares_params_the_schema_checks(registry):
    """Each param typed (bool, int, float, str, or one | None) and defaulted: a bare name is valid."""
    for name in registry:
        params = config_issues.params_model(registry.get(name))
        assert not [param for param, field in params.model_fields.items() if field.is_required()], name
        params.model_validate({})  # every default passes its own rules
        RunConfig.from_dict(merged(READS_EVERY_OPERATOR, {
            "explorer" if registry is EXPERIENCE_OPERATORS else "buffer":
                {"pipeline" if registry is EXPERIENCE_OPERATORS else "task_pipeline": [name]}}))


def test_every_preset_and_example_is_still_valid():
    for preset in PRESETS.values():
        RunConfig.from_dict(preset.config)
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path)


# ---- a key twice in one mapping (found by a reviewer, 2026-12-06) --------------------------------

TWICE = "trainer:\n  lr: 0.001\nalgorithm:\n  name: grpo\ntrainer:\n  total_steps: 3\n"


@pytest.mark.parametrize("text, expected", [
    (TWICE, "line 5: key 'trainer' appears twice in one mapping (first on line 1)"),
    ("trainer: {lr: 0.001, lr: 0.002}", "line 1: key 'lr' appears twice"),
    ('{"trainer": {"lr": 0.001}, "trainer": {"total_steps": 3}}', "key 'trainer' appears twice"),
])
def test_a_key_twice_in_one_mapping_is_refused_not_kept_last(text, expected):
    """PyYAML and json keep the last: the first `trainer:` section's lr was dropped without a word."""
    with pytest.raises(ConfigError) as refused:
        parse_config_text(text)
    assert expected in str(refused.value)
    assert parse_config_text("trainer: {lr: 0.001}\nexplorer: {lr: 0.001}") == {  # the same key in two mappings
        "trainer": {"lr": 0.001}, "explorer": {"lr": 0.001}}


def test_a_key_twice_is_a_form_error_in_the_yaml_box_and_a_400_on_the_api(page, api):
    errors = form_errors(page.post(LAUNCH, {"name": "x", "editor": "yaml", "yaml": TWICE}))
    assert "key &#x27;trainer&#x27; appears twice" in errors or "key 'trainer' appears twice" in errors
    assert "appears twice" in refusal(api(TWICE))["<config>"]
    assert not Run.objects.exists()
