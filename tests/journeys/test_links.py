"""A reader follows every page the README and docs/ name: each resolves for a logged-in user.

Paths are taken from the documents themselves (backticked `/...` paths and the dashboard URL), so
a page renamed without its docs fails here. Placeholders such as `<id>` become a real run's id.
"""
import re
from pathlib import Path

import pytest

from apps.runs.models import Run
from workers.rft.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_PAGES = ("/ws/", "/usr/", "/root/", "/etc/", "/tmp/", "/path/")  # websockets and file paths
PATH = re.compile(r"`(/[^`\s]*)`|https?://127\.0\.0\.1:\d+(/[^\s)`]*)")


def documented_pages() -> dict[str, list[str]]:
    """Each documented page path -> the documents naming it."""
    pages: dict[str, list[str]] = {}
    for document in DOCUMENTS:
        for match in PATH.finditer(document.read_text()):
            path = match[1] or match[2]
            if not path.startswith(NOT_PAGES):
                pages.setdefault(path, []).append(document.relative_to(ROOT).as_posix())
    return pages


def test_the_documents_name_pages():
    assert {"/annotate/", "/runs/new/", "/tasksets/imports/new/"} <= set(documented_pages())


@pytest.mark.parametrize("path", sorted(documented_pages()))
def test_every_documented_page_resolves_for_a_logged_in_user(client, curator, path):
    run = Run.objects.create(name="docs run", owner=curator, config=RunConfig().to_dict(), mode="both")
    client.force_login(curator)
    url = re.sub(r"<[^>]+>", str(run.pk), path)
    response = client.get(url, follow=True)
    assert response.status_code == 200, (
        f"{path} (named in {', '.join(documented_pages()[path])}) answered {response.status_code}"
    )
