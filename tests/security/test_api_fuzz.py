"""Property-based fuzzing of the JSON API: whatever a client sends, the answer is JSON with a
4xx status naming the problem (never a 500 or an HTML page), and only a 201 creates a run."""
import json

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.runs.api import token_for
from apps.runs.models import Run
from apps.tasksets.models import Taskset

pytestmark = pytest.mark.slow

CONFIG_KEYS = ["mode", "seed", "model", "algorithm", "explorer", "trainer", "buffer", "synchronizer", "feedback",
               "path", "name", "batch_size", "lr", "total_steps", "repeat_times", "max_new_tokens", "taskset", "kl",
               "coef"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(CONFIG_KEYS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={"name": json_values, "config": json_values | st.text(max_size=200)}).map(
        lambda v: json.dumps(v).encode()
    ),
)
query = st.dictionaries(
    st.sampled_from(
        ["status", "owner", "q", "page", "page_size", "since", "role", "step", "min_reward", "max_reward", "source"]
    ),
    st.text(max_size=12),
    max_size=4,
)
ENDPOINTS = [
    "api-runs", "api-run", "api-run-metrics", "api-run-experiences", "api-run-pause", "api-run-resume", "api-run-stop"
]


@pytest.fixture
def fuzz_client(researcher):
    Taskset.objects.create(name="arithmetic")
    run = Run.objects.create(name="target", owner=researcher, config={})
    return Client(HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}"), run


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    run_offset=st.sampled_from([0, 0, 0, 1, 10**6]),
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
    body=bodies,
    params=query,
)
def test_the_api_answers_anything_with_json_and_never_a_500(fuzz_client, endpoint, run_offset, method, body, params):
    client, run = fuzz_client
    url = reverse(endpoint) if endpoint == "api-runs" else reverse(endpoint, args=[run.pk + run_offset])
    runs_before = Run.objects.count()
    if method == "GET":
        response = client.get(url, params)
    else:
        response = client.generic(method, url, body, content_type="application/json")
    assert response.status_code < 500, response.content[:300]
    assert response["Content-Type"] == "application/json"
    payload = response.json()
    if response.status_code >= 400:
        assert isinstance(payload.get("error"), str) and payload["error"]
    created = Run.objects.count() - runs_before
    assert created == (1 if response.status_code == 201 else 0)


# ---- the token header and YAML structure (issue #20) ---------------------------------------------

digits = st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1, max_size=30)  # '²', '١', '٣'...
authorization = st.one_of(
    st.text(max_size=80),
    st.builds(lambda scheme, user_id, mac: f"{scheme} rft_{user_id}_{mac}",
              st.sampled_from(["Bearer", "bearer", "Basic", ""]),
              digits | st.integers(min_value=0, max_value=10**30).map(str) | st.just("9" * 5000),
              st.text(alphabet="0123456789abcdefABCDEF", max_size=70)),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(header=authorization)
def test_any_authorization_header_gets_json_and_never_a_500(db, header):
    response = Client().get(reverse("api-runs"), HTTP_AUTHORIZATION=header)
    assert response.status_code in (401, 200) and response["Content-Type"] == "application/json", response.content[:300]
    if response.status_code == 401:
        assert response.json()["error"]


def yaml_texts():
    """Config texts built to hurt: anchors and aliases, deep nesting, merge keys, odd tags."""
    anchors = st.sampled_from(["a", "b", "c"])
    scalars = st.sampled_from(["1", "x", ".nan", "2024-01-01", "2024-02-30", "!!binary aGk=", '"s"', "~", "9" * 40])
    aliased = (
        st.builds(lambda anchor, value: f"&{anchor} {value}", anchors, scalars) | anchors.map(lambda name: f"*{name}")
    )
    flows = st.recursive(
        scalars | aliased,
        lambda inner: st.lists(inner, max_size=5).map(lambda items: f"[{', '.join(items)}]")
        | st.lists(st.tuples(st.sampled_from(["desc", "k", "is_slippery", "<<"]), inner), max_size=4).map(
            lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
        ),
        max_leaves=20,
    )
    deep = st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n)
    return st.builds(
        lambda where, value: where.format(value),
        st.sampled_from([
            "buffer: {{taskset: arithmetic}}\nexplorer:\n  workflow: multi_turn\n  workflow_args:\n"
            "    env: frozenlake\n    env_args: {{desc: {}}}\n",
            "buffer: {{taskset: arithmetic}}\nseed: {}\n",
            "{}",
        ]),
        flows | deep,
    )


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(text=yaml_texts())
def test_any_yaml_config_gets_json_never_a_500_and_nothing_big_is_stored(fuzz_client, text):
    client, _ = fuzz_client
    runs_before = set(Run.objects.values_list("pk", flat=True))
    response = client.post(
        reverse("api-runs"), json.dumps({"name": "fuzz", "config": text}), content_type="application/json"
    )
    assert response.status_code in (201, 400), response.content[:300]
    assert response["Content-Type"] == "application/json"
    created = Run.objects.exclude(pk__in=runs_before)
    assert created.count() == (response.status_code == 201)
    if "&" in text or "*" in text:  # anchors and aliases are refused whatever they hold
        assert response.status_code == 400
    for config in created.values_list("config", flat=True):
        assert len(json.dumps(config)) <= 64 * 1024
