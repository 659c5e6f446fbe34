"""Hostile run configs (issue #20, findings 1 and 4): config text is read with limits before
anything walks it (no YAML anchors or aliases, at most MAX_CONFIG_CHARS characters and
MAX_CONFIG_DEPTH levels), a config sent as JSON is bounded the same way, and a workflow's settings
are bounded JSON values of the types the workflow or environment takes. Each is refused with a 400
naming the problem (a form error on the launch page), never a 500, and nothing is created."""
import json
import time

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.forms import LaunchForm
from apps.runs.models import Run
from tests.security.test_bad_configs import GOOD  # the smallest config that launches
from tests.support import taskset_with_a_task
from workers.rft.config import MAX_CONFIG_CHARS, MAX_CONFIG_DEPTH
from workers.rft.workflows.base import MAX_ARG_CHARS, MAX_ARG_DEPTH

GOOD_YAML = yaml.safe_dump(GOOD)
ENV_ARGS = "explorer.workflow_args.env_args"


def with_env_args(env_args) -> dict:
    """GOOD playing frozenlake with these environment settings."""
    workflow = {"workflow": "multi_turn", "workflow_args": {"env": "frozenlake", "env_args": env_args}}
    return {**GOOD, "explorer": {**GOOD["explorer"], **workflow}}


def alias_bomb(levels: int) -> str:
    """The issue's config: env_args.desc holds &a0 [10 x "lol"], &a1 [10 x *a0], ...: each level x10."""
    items = ["&a0 [" + ", ".join(['"lol"'] * 10) + "]"]
    items += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return yaml_config(f"{{desc: [{', '.join(items)}]}}")


def yaml_config(env_args_text: str) -> str:
    explorer = "\n".join(f"  {key}: {value}" for key, value in GOOD["explorer"].items())
    rest = yaml.safe_dump({key: value for key, value in GOOD.items() if key != "explorer"})
    return (
        f"{rest}explorer:\n{explorer}\n  workflow: multi_turn\n  workflow_args:\n"
        f"    env: frozenlake\n    env_args: {env_args_text}\n"
    )


def nested(depth: int, leaf="SFFF"):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def api(researcher):
    taskset_with_a_task("arith")
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")

    def post(config):
        return client.post(
            reverse("api-runs"), json.dumps({"name": "hostile", "config": config}), content_type="application/json"
        )

    return post


def refusal(response) -> dict[str, str]:
    """{key: message} of a 400 invalid-config answer."""
    assert response.status_code == 400, response.content[:500]
    assert response["Content-Type"] == "application/json"
    return {error["key"]: error["message"] for error in response.json()["errors"]}


def test_the_controls_launch(api):
    """The text and JSON forms of a good frozenlake config launch: the cases below break one thing."""
    assert api(yaml_config("{desc: [SFFF, FHFH, FFFH, HFFG], is_slippery: true}")).status_code == 201
    assert api(with_env_args({"map_name": "8x8"})).status_code == 201


# ---- config text --------------------------------------------------------------------------------

TEXT_CASES = {
    # finding 1: 399 bytes that expanded to 8 MB stored
    "alias-bomb": (alias_bomb(5), "anchors and aliases (&a0, *a0) are not accepted"),
    "one-anchor": (GOOD_YAML + "seed: &s 3\n", "anchors and aliases (&s, *s) are not accepted"),
    "merge-key": (GOOD_YAML + "x: &m {a: 1}\nfeedback: {<<: *m}\n", "anchors and aliases"),
    # finding 4: a RecursionError inside PyYAML
    "deep-flow": ("a: " + "[" * 50_000 + "]" * 50_000, f"nested more than {MAX_CONFIG_DEPTH} levels deep"),
    "deep-flow-mappings": ("a: " + "{a: " * 50_000 + "1" + "}" * 50_000, f"nested more than {MAX_CONFIG_DEPTH} levels"),
    "deep-block": ("".join(" " * i + "a:\n" for i in range(MAX_CONFIG_DEPTH + 1)) + " " * 70 + "b: 1\n", "levels deep"),
    "too-long": (GOOD_YAML + "#" * MAX_CONFIG_CHARS, f"at most {MAX_CONFIG_CHARS}"),
    # values no JSON can hold, which Postgres would refuse with a 500
    "binary": (yaml_config("{desc: !!binary aGVsbG8=}"), "got bytes"),
    "a-set": (yaml_config("{desc: !!set {a, b}}"), "got set"),
    "a-date": (yaml_config("{map_name: 2024-01-01}"), "got date (quote it"),
    "a-date-key": (yaml_config("{2024-01-01: 4x4}"), "not a string: datetime.date(2024, 1, 1)"),
    "impossible-date": (GOOD_YAML + "x: 2024-02-30\n", "not valid YAML or JSON: day is out of range"),
    "5000-digit-int": (GOOD_YAML + "x: " + "9" * 5000 + "\n", "not valid YAML or JSON"),
    "nan": (yaml_config("{desc: [.nan]}"), "must be a finite number"),
}


@pytest.mark.parametrize("text, words", TEXT_CASES.values(), ids=TEXT_CASES.keys())
def test_hostile_config_text_is_refused_on_the_api(api, text, words):
    errors = refusal(api(text))
    assert any(words in f"{key}: {message}" for key, message in errors.items()), errors
    assert Run.objects.count() == 0


@pytest.mark.parametrize("case", ["alias-bomb", "deep-flow", "binary"])
def test_hostile_config_text_is_a_form_error_on_the_launch_page(researcher_client, case):
    taskset_with_a_task("arith")
    text, words = TEXT_CASES[case]
    response = researcher_client.post(reverse("run-launch"), {"name": "hostile", "editor": "yaml", "yaml": text})
    assert response.status_code == 200 and Run.objects.count() == 0
    form = response.context["form"]
    assert any(words in message for message in form.errors.get("yaml", [])), form.errors


# ---- a config sent as JSON ----------------------------------------------------------------------

JSON_CASES = {
    "deep": (lambda: {**GOOD, "x": nested(MAX_CONFIG_DEPTH + 1)}, "x", "levels deep"),
    "huge": (
        lambda: {**GOOD, "x": ["a" * 1000] * (MAX_CONFIG_CHARS // 1000)}, "<config>", f"more than {MAX_CONFIG_CHARS}"
    ),
    "nan-anywhere": (lambda: {**GOOD, "trainer": {"lr": float("nan")}}, "trainer.lr", "finite"),
}


@pytest.mark.parametrize("make, key, words", JSON_CASES.values(), ids=JSON_CASES.keys())
def test_a_config_sent_as_json_is_bounded_the_same_way(api, make, key, words):
    errors = refusal(api(make()))
    assert any((at == key or at.startswith(f"{key}[")) and words in message for at, message in errors.items()), errors
    assert Run.objects.count() == 0


# ---- workflow settings: a bounded JSON value of the type taken ---------------------------------

ENV_ARGS_CASES = {
    "too-long": ({"desc": ["F" * 1000] * (MAX_ARG_CHARS // 1000 + 1)}, ENV_ARGS, f"more than {MAX_ARG_CHARS}"),
    "too-deep": ({"desc": nested(MAX_ARG_DEPTH)}, ENV_ARGS, f"more than {MAX_ARG_DEPTH} levels deep"),
    "wrong-type": ({"is_slippery": "yes"}, f"{ENV_ARGS}.is_slippery", "takes bool, got 'yes'"),
    "wrong-item-type": ({"desc": ["SFFF", 3]}, f"{ENV_ARGS}.desc", "takes list[str] | None"),
    "unknown-setting": ({"lol": [1]}, ENV_ARGS, "unexpected keyword argument 'lol'"),
    # of the right types, refused by the environment itself: the run failed at its first step
    "unknown-map": ({"map_name": "9x9"}, ENV_ARGS, "frozenlake does not start with these settings: KeyError"),
    "empty-map": ({"desc": []}, ENV_ARGS, "does not start with these settings: ValueError"),
    "ragged-map": ({"desc": ["SF", "FFG"]}, ENV_ARGS, "does not start with these settings"),
}


@pytest.mark.parametrize("env_args, key, words", ENV_ARGS_CASES.values(), ids=ENV_ARGS_CASES.keys())
def test_env_args_are_checked_by_type_and_size(api, env_args, key, words):
    errors = refusal(api(with_env_args(env_args)))
    assert words in errors[key], errors
    assert Run.objects.count() == 0


def test_other_workflow_settings_are_bounded_too(api):
    tools = {**GOOD, "explorer": {**GOOD["explorer"], "workflow": "tool_calling",
                                  "workflow_args": {"tools": ["calculator"] * (MAX_ARG_CHARS // 10)}}}
    errors = refusal(api(tools))
    assert f"more than {MAX_ARG_CHARS}" in errors["explorer.workflow_args.tools"]


# ---- the figure: the worst config text of at most 4 KB ------------------------------------------

# Each tries one way to make a small text cost much: aliases, depth of flow or block nesting, the
# most JSON per byte of YAML, many keys (each an error with a hint), the longest numbers.
WORST_SMALL_CONFIGS = {
    "alias-bomb-6": alias_bomb(6),
    "deep-flow": "a: " + "[" * 2000 + "]" * 2000,
    "deep-block": "".join(" " * i + "a:\n" for i in range(88)),
    "one-char-strings": yaml_config("{desc: [" + ",".join(["F"] * 1800) + "]}"),
    "empty-lists": yaml_config("{desc: [" + ",".join(["[]"] * 1200) + "]}"),
    "unknown-keys": "{" + ",".join(f"k{i}: 1" for i in range(520)) + "}",
    "long-number": yaml_config("{desc: [" + "9" * 3850 + "]}"),
}


@pytest.mark.parametrize("name", WORST_SMALL_CONFIGS)
def test_no_config_of_4_kb_is_stored_big_or_validated_slowly(api, name):
    text = WORST_SMALL_CONFIGS[name]
    assert len(text.encode()) <= 4096
    started = time.perf_counter()
    response = api(text)
    seconds = time.perf_counter() - started
    assert response.status_code in (201, 400), response.content[:300]
    stored = sum(len(json.dumps(config)) for config in Run.objects.values_list("config", flat=True))
    assert stored <= 64 * 1024
    assert seconds < 2  # the aim is 0.1 s (see docs/security.md); loose here: the test machine is shared


def test_deep_json_in_the_launch_forms_own_field_is_no_500(researcher_client):
    """The form editor carries the config as JSON in a hidden field, which a client can rewrite."""
    taskset_with_a_task("arith")
    launch = reverse("run-launch")
    unreadable = researcher_client.post(launch, {"name": "x", "editor": "form", "base": "[" * 50_000 + "]" * 50_000})
    assert unreadable.status_code in (200, 302)  # read as no base config, like any other broken JSON there
    initial = LaunchForm.for_config(GOOD).initial  # every field as the page fills it in
    fields = {key: value for key, value in initial.items() if value is not None and value is not False}
    deep = json.dumps({**GOOD, "x": nested(900)})
    response = researcher_client.post(launch, {**fields, "name": "deep", "editor": "form", "base": deep})
    assert response.status_code == 200 and not Run.objects.filter(name="deep").exists()
    assert "levels deep" in str(response.context["form"].errors)


def test_a_config_with_hundreds_of_problems_gets_a_short_reply():
    from workers.rft.config import MAX_REPORTED_ISSUES, ConfigError, RunConfig, parse_config_text

    text = "\n".join(f"k{i}: 1" for i in range(520))  # 4 KB of unknown keys
    with pytest.raises(ConfigError) as refused:
        RunConfig.from_dict(parse_config_text(text))
    assert len(refused.value.errors) == MAX_REPORTED_ISSUES + 1
    assert refused.value.errors[-1].message == f"and {520 - MAX_REPORTED_ISSUES} more problems"
    assert len(str(refused.value)) < 8_000
