"""Issue #30, low finding 10: a NUL in any query parameter or form field is a 400 naming it (JSON
under /api/, a page elsewhere), never a 500 from the database; and whatever goes wrong under
/api/ answers JSON, never an HTML page."""
import pytest
from django.test import Client
from django.urls import reverse

from apps.feedback.models import RunAnnotators
from apps.runs import queries
from apps.runs.api import token_for
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(researcher):
    return Run.objects.create(name="r", owner=researcher, config={})


@pytest.fixture
def production(settings):
    """DEBUG off, as the probe ran: Django's error handlers answer, not its debug pages."""
    settings.DEBUG = False


def api_get(researcher, url, **params):
    return Client(raise_request_exception=False).get(url, params, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")


def test_a_nul_in_an_api_query_parameter_is_a_json_400(production, researcher, run):
    response = api_get(researcher, reverse("api-run-metrics", args=[run.pk]), role="\x00")
    assert (response.status_code, response["Content-Type"]) == (400, "application/json")
    assert response.json()["error"] == "the query parameter 'role' holds a NUL character (\\x00), which is never valid"


def test_a_nul_in_a_form_field_is_a_400_page_and_changes_nothing(production, researcher_client, run):
    response = researcher_client.post(reverse("annotate-assign", args=[run.pk]), {"usernames": "a\x00b"})
    assert response.status_code == 400
    assert "the form field 'usernames' holds a NUL character" in response.content.decode()
    assert not RunAnnotators.objects.exists()


@pytest.mark.parametrize(
    "url, params, where",
    [("/runs/", {"q": "x\x00"}, "the query parameter 'q'"), ("/tasksets/a%00b/", {}, "the address")],
)
def test_a_nul_in_a_page_address_or_query_parameter_is_a_400_page(production, researcher_client, url, params, where):
    response = researcher_client.get(url, params)
    assert response.status_code == 400 and f"{where} holds a NUL character" in response.content.decode()


def test_an_unhandled_error_under_the_api_answers_json(production, researcher, run, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(queries, "metrics_by_role", broken)
    response = api_get(researcher, reverse("api-run-metrics", args=[run.pk]))
    assert (response.status_code, response["Content-Type"]) == (500, "application/json")
    assert response.json() == {"error": "internal server error"}


def test_an_unknown_api_address_answers_json(production, researcher):
    response = api_get(researcher, "/api/no-such-thing/")
    assert (response.status_code, response["Content-Type"]) == (404, "application/json")
    assert response.json() == {"error": "not found: /api/no-such-thing/"}
