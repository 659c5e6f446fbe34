"""The API's docs page (/api/docs/): Swagger UI from this site's static files renders every
operation of /api/openapi.json under the CSP, with no console error, inside the site's header; "Try
it out" calls the API with the user's token, and the curl line it shows carries that token and no
X-CSRFToken header (issue #42, finding 10: the page had no header or nav, no link from the app,
and its curl lines carried a CSRF header a script has no use for)."""
import os
import re

import pytest
from playwright.sync_api import expect

from apps.runs.api import token_for
from apps.runs.models import Run

from .test_csp import LISTEN, violations

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SHOTS = os.environ.get("RFTWEB_SHOTS")  # a folder: the test leaves a screenshot of the page there


def test_the_docs_page_renders_every_operation_and_tries_one_out(page, login, researcher, page_errors):
    Run.objects.create(name="documented", owner=researcher, config={})
    console = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.add_init_script(LISTEN)
    page.set_viewport_size({"width": 1366, "height": 768})
    login(researcher, "/")
    page.locator(".topbar nav").get_by_role("link", name="API").click()
    expect(page).to_have_url(re.compile(r"/api/docs/$"))

    expect(page.locator(".swagger-ui .info .title")).to_contain_text("rftweb")
    spec = page.request.get("/api/openapi.json").json()
    methods = ("get", "post", "put", "patch", "delete")
    documented = sum(method in item for item in spec["paths"].values() for method in methods)
    expect(page.locator(".opblock")).to_have_count(documented)
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, "api-docs.png"))

    # "Try it out" on the runs list: the request goes with the session, the answer lists the run.
    listing = page.locator(".opblock-get").filter(has_text=re.compile(r"/api/runs/\s*List runs"))
    listing.locator(".opblock-summary").click()
    listing.get_by_role("button", name="Try it out").click()
    listing.get_by_role("button", name="Execute").click()
    expect(listing.locator(".live-responses-table tbody .response-col_status")).to_have_text("200")
    expect(listing.locator(".live-responses-table")).to_contain_text("documented")
    curl = listing.locator(".curl-command").inner_text()
    assert f"Authorization: Bearer {token_for(researcher)}" in curl and "X-CSRFToken" not in curl, curl

    page.wait_for_load_state("networkidle")
    errors = [line for line in console if line.startswith("error")]
    assert errors == [] and violations(page, console) == [] and page_errors == [], (errors, violations(page, console))
