"""A curator runs the team from the app (issue #44, item 5): adds an annotator on the People page,
assigns them to a run whose owner limited who annotates it, and the new annotator logs in and finds
that run to annotate; taking the role away shuts them out again. In Chromium on the full stack's
server, and embedded through the same views."""
import re

import pytest
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect

from apps.buffer.models import Experience
from apps.core.bidi import isolate
from apps.feedback.models import RunAnnotators
from apps.runs.models import Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
NEW_PASSWORD = "a long enough one 42"


def limited_run(owner) -> Run:
    run = Run.objects.create(name="limited", owner=owner, config={}, status=Run.Status.RUNNING)
    Experience.objects.create(run=run, explorer_step=0, rollout_index=0, group_id="g", prompt_text="1 + 1?",
                              response_text="2", prompt_ids=[1], response_ids=[2], action_mask=[1], reward=1.0)
    RunAnnotators.objects.create(run=run, open_to_all=False)
    return run


def test_a_curator_adds_an_annotator_and_assigns_a_run_in_the_browser(curator, researcher, page, login, browser,
                                                                     asgi_server):
    run = limited_run(researcher)
    login(curator, "/accounts/people/")
    form = page.locator("#add-person")
    form.get_by_label("Username").fill("dana")
    form.get_by_label("Password").fill(NEW_PASSWORD)
    form.locator("input[value=annotator]").check()
    form.get_by_role("button", name="Add").click()
    page.wait_for_url(re.compile(r"/accounts/people/\d+/$"))
    expect(page.locator(".flash")).to_contain_text("Added dana (annotator)")
    page.locator("#person-runs select").select_option(label=f"{isolate('limited')} #{run.pk}")
    page.locator("#person-runs").get_by_role("button", name="Assign").click()
    expect(page.locator("#person-runs")).to_contain_text("limited")

    dana = browser.new_context(base_url=asgi_server).new_page()
    dana.goto("/annotate/")
    dana.get_by_label("Username").fill("dana")
    dana.get_by_label("Password").fill(NEW_PASSWORD)
    dana.get_by_role("button", name="Log in").click()
    expect(dana.locator("main")).to_contain_text("limited")

    page.locator("#person-roles input[value=annotator]").uncheck()
    page.locator("#person-roles").get_by_role("button", name="Save").click()
    expect(page.locator(".flash")).to_contain_text("Saved dana: no role")
    dana.goto("/annotate/")
    expect(dana.locator("h1")).to_contain_text("You cannot open this page")


def test_embedded_the_same_through_the_same_views(curator, researcher, settings):
    settings.RFTWEB_EMBEDDED = True
    run = limited_run(researcher)
    client = Client()
    client.force_login(curator)
    added = client.post(reverse("people"), {"username": "dana", "password": NEW_PASSWORD, "roles": ["annotator"]})
    assert added.status_code == 302
    dana_page = added.url
    pk = int(dana_page.rstrip("/").rsplit("/", 1)[1])
    client.post(reverse("person-assign", args=[pk]), {"run": run.pk})
    dana = Client()
    assert dana.login(username="dana", password=NEW_PASSWORD)
    assert "limited" in dana.get(reverse("annotate-start")).content.decode()
    client.post(reverse("person-roles", args=[pk]), {"roles": [], "active": "on"})
    assert dana.get(reverse("annotate-start")).status_code == 403
