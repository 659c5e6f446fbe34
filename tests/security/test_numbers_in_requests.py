"""Ids, steps and limits people put in URLs, forms and JSON: a wrong one is answered as wrong (400,
404, or the page without it), never a 500.

A walkthrough found `/runs/compare/?runs=99999999999999999999` a 500 on SQLite (OverflowError: an
`__in` lookup reaches the database, which Django guards only for `exact` and the ranges) and
`?runs=²` a 500 in both modes ("²".isdigit() is true and int() refuses it). Both are read by one
helper now (apps/core/numbers.py); these tests run on Postgres and on SQLite (`make test-sqlite`).
"""
import json
import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils.html import escape

from apps.core.numbers import MAX_ID, whole_number, whole_numbers
from apps.runs.api import token_for
from apps.runs.models import Run

HUGE = "99999999999999999999"  # past a bigint (2**63 - 1 has 19 digits)
NOT_ASCII = "²"  # str.isdigit() says yes; int() says no


@pytest.mark.parametrize(("value", "expected"), [
    ("12", 12), (" 7 ", 7), ("0", 0), (5, 5), (str(MAX_ID), MAX_ID), (MAX_ID, MAX_ID),
    (HUGE, None), (MAX_ID + 1, None), (NOT_ASCII, None), ("١٢", None), ("-3", None), (-3, None), ("+3", None),
    ("1.5", None), (1.0, None), (True, None), (None, None), ("", None), ("1e3", None), ([1], None),
])
def test_whole_number_takes_ascii_digits_within_a_bigint_and_nothing_else(value, expected):
    assert whole_number(value) == expected


def test_whole_numbers_keep_the_good_ones_in_order():
    assert whole_numbers(["3", NOT_ASCII, "1", HUGE, " 2"]) == [3, 1, 2]


def _int_urls(resolver, prefix="") -> list[str]:
    """Every URL pattern of the site with an <int:...> part, that part filled with HUGE."""
    urls = []
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            urls += _int_urls(pattern, route)
        elif isinstance(pattern, URLPattern) and "<int:" in route and "(?P" not in route:
            urls.append("/" + re.sub(r"<str:\w+>", "x", re.sub(r"<int:\w+>", HUGE, route)))
    return urls


@pytest.mark.django_db
def test_every_page_with_an_id_in_its_path_answers_an_id_past_a_bigint_without_a_500(curator):
    client = Client()
    client.force_login(curator)
    urls = _int_urls(get_resolver())
    assert len(urls) > 30  # the walk found the site's pages
    answered = {(method, url): getattr(client, method)(url).status_code for url in urls for method in ("get", "post")}
    assert not [key for key, status in answered.items() if status >= 500]


@pytest.fixture
def client_of(curator):
    client = Client()
    client.force_login(curator)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("value", [HUGE, NOT_ASCII])
def test_query_ids_that_are_no_ids_are_left_out_of_the_page(client_of, curator, value):
    run = Run.objects.create(name="kept", owner=curator, config={})
    compare = client_of.get(reverse("run-compare"), {"runs": [value, run.pk], "task": value, "step": value})
    assert compare.status_code == 200 and [r.pk for r in compare.context["picked_runs"]] == [run.pk]
    named = f"runs={value}" if value == HUGE else f"runs={value!r}"
    assert escape(f"Not compared: {named}") in compare.content.decode()
    # A download names the value: it said "no run was given" for an id past a bigint.
    for name in ("compare-metrics-csv", "compare-metrics-json"):
        for runs in ([value], [value, run.pk]):
            refused = client_of.get(reverse(name), {"runs": runs})
            assert refused.status_code == 400 and named in refused.content.decode()
    launch = client_of.get(reverse("run-launch"), {"from": value})
    assert launch.status_code == 200 and launch.context["preset_name"]  # the default preset, not a copy
    annotate = client_of.get(reverse("annotate-start"), {"run": value})
    assert annotate.status_code in (200, 302, 404)
    stop = client_of.post(reverse("run-bulk-stop"), {"runs": [value]})
    assert stop.status_code == 302
    assert Run.objects.get(pk=run.pk).status == run.status


@pytest.mark.django_db
@pytest.mark.parametrize("value", [HUGE, NOT_ASCII, "-1"])
def test_numbers_in_forms_and_json_that_are_no_numbers_get_a_clear_error(client_of, curator, annotator, value):
    run = Run.objects.create(name="kept", owner=curator, config={})
    logs = client_of.get(reverse("run-logs", args=[run.pk]), {"limit": value})
    assert logs.status_code == 400 and "limit must be a whole number" in logs.json()["error"]

    api = Client().get(reverse("api-run-metrics", args=[run.pk]), {"since": value},
                       HTTP_AUTHORIZATION=f"Bearer {token_for(curator)}")
    assert api.status_code == 400 and "since must be a step number" in api.json()["error"]

    assign = client_of.post(reverse("person-assign", args=[annotator.pk]), {"run": value}, follow=True)
    assert "Pick a run" in assign.content.decode()

    report = client_of.post(reverse("report-save"), {"name": "r", "runs": f"{value},{run.pk}"})
    problem = "too large for an id" if value == HUGE else "is not an id"
    assert report.status_code == 400 and problem in report.content.decode()

    annotating = Client()
    annotating.force_login(annotator)
    undo = annotating.post(reverse("annotate-api-undo"), json.dumps({"feedback": value}),
                           content_type="application/json")
    assert undo.status_code == 400 and "feedback must be the id of a judgement" in undo.json()["error"]
