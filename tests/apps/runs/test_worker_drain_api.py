"""A curator drains or undrains a worker through the API (POST /api/workers/<name>/drain/ and
undrain/), as from its page: by token or by session with the CSRF token, curators only (403), a
name no worker registered a 404 naming it, a worker not live (or the embedded server) a 409, and
one that does not answer within 3 s a 503 saying nothing changed, which is so. Here the broker is
the tests' real Redis with no worker behind it; tests/workers/test_drain.py drains a real Celery
worker through this API too."""
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.runs.api import token_for
from apps.runs.models import Worker

pytestmark = pytest.mark.django_db
NAME = "train@gpu 1/ü"  # a name with a space, a slash and an accent: quoted in the path


def worker(name=NAME, *, seen_ago=0.0):
    now = timezone.now()
    return Worker.objects.create(name=name, host="elsewhere", pid=4242, queues=["train"], slots=2,
                                 started_at=now - timedelta(hours=1), last_seen=now - timedelta(seconds=seen_ago))


def script(user) -> Client:
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")


def drain(client, name=NAME, action="drain"):
    return client.post(reverse(f"api-worker-{action}", kwargs={"name": name}))


@pytest.mark.parametrize("action", ["drain", "undrain"])
def test_only_a_curator_drains_a_worker(researcher, action):
    worker()
    response = drain(script(researcher), action=action)
    assert response.status_code == 403 and response.json() == {"error": f"only a curator may {action} a worker"}
    assert Worker.objects.get(name=NAME).drain == {}


def test_an_unknown_worker_is_a_404_naming_it(curator):
    response = drain(script(curator), "nobody@nowhere")
    assert response.status_code == 404
    assert response.json()["error"] == "worker 'nobody@nowhere' is not live: no worker of that name has registered"


@pytest.mark.parametrize("why", ["lost", "stopped", "embedded"])
def test_a_worker_not_live_is_a_409_and_nothing_changes(curator, settings, why):
    row = worker(seen_ago=3600 if why == "lost" else 0)
    if why == "stopped":
        Worker.objects.filter(pk=row.pk).update(stopped_at=timezone.now())
    if why == "embedded":
        settings.RFTWEB_EMBEDDED = True
    response = drain(script(curator))
    assert response.status_code == 409, response.content
    assert ("embedded server" if why == "embedded" else "is not live") in response.json()["error"]
    assert Worker.objects.get(pk=row.pk).drain == {}


def test_a_worker_that_does_not_answer_is_a_503_and_nothing_changes(curator):
    worker()
    response = drain(script(curator))
    assert response.status_code == 503 and response["Content-Type"] == "application/json"
    assert response.json() == {"error": f"worker {NAME!r} did not answer (stopping, or the broker is down): "
                                        "nothing changed; try again"}
    assert Worker.objects.get(name=NAME).drain == {}


def test_a_session_post_needs_the_csrf_token(curator):
    worker()
    client = Client(enforce_csrf_checks=True)
    client.force_login(curator)
    refused = drain(client)
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    client.get(reverse("api-docs"))  # sets the CSRF cookie, as any page does
    response = client.post(reverse("api-worker-drain", kwargs={"name": NAME}),
                           HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 503  # through the checks, to the worker, which does not answer here


def test_a_get_of_the_drain_address_is_a_405_and_a_worker_page_stays_a_get(curator):
    worker()
    assert script(curator).get(reverse("api-worker-drain", kwargs={"name": NAME})).status_code == 405
    page = script(curator).get(reverse("api-worker", kwargs={"name": NAME}))
    assert page.status_code == 200 and page.json()["worker"]["name"] == NAME
