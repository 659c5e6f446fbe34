"""API tokens (issue #20, findings 5 and 7): one spelling per token; a malformed one is a 401, never
a 500, with no login needed to send it; the token page is never cached; a checkpoint's
download_url takes the token like the API does."""
import io
import tarfile

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.models import Checkpoint, Run
from apps.runs.supervision import run_dir


def api_get(token: str):
    return Client().get(reverse("api-runs"), HTTP_AUTHORIZATION=f"Bearer {token}")


def test_the_token_as_issued_authenticates(researcher):
    assert api_get(token_for(researcher)).status_code == 200


def mac_of(user) -> str:
    return token_for(user).rsplit("_", 1)[1]


MALFORMED = {
    "leading-zero": lambda user: f"rft_0{user.pk}_{mac_of(user)}",  # a second spelling of the real token
    "superscript-digit": lambda user: f"rft_²_{mac_of(user)}",  # '²'.isdigit() is True; int('²') fails
    "arabic-indic-digit": lambda user: f"rft_{chr(0x661)}_{mac_of(user)}",  # int() reads it as 1
    "5000-digit-id": lambda user: f"rft_{'9' * 5000}_{mac_of(user)}",
    "id-past-bigint": lambda user: f"rft_{2**63}_{mac_of(user)}",
    "upper-case-mac": lambda user: f"rft_{user.pk}_{mac_of(user).upper()}",
    "no-id": lambda user: f"rft__{mac_of(user)}",
    "another-prefix": lambda user: token_for(user).replace("rft_", "rfx_"),
}


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_token_is_a_401(researcher, make):
    response = api_get(make(researcher))
    assert response.status_code == 401, response.content[:300]
    assert response.json()["error"] == "invalid API token"


def test_the_token_page_is_never_cached(researcher_client):
    response = researcher_client.get(reverse("api-token"))
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]


@pytest.fixture
def checkpoint(researcher, settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    run = Run.objects.create(name="r", owner=researcher, config={})
    directory = run_dir(run) / "checkpoints" / "v1"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"weights")
    return Checkpoint.objects.create(run=run, version=1, step=1, path=str(directory))


def test_a_script_downloads_a_checkpoint_with_its_token(researcher, checkpoint):
    script = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    url = script.get(reverse("api-run", args=[checkpoint.run.pk])).json()["checkpoints"][0]["download_url"]
    response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    assert response.status_code == 200, response.content[:300]
    with tarfile.open(fileobj=io.BytesIO(b"".join(response))) as tar:
        assert any(name.endswith("model.safetensors") for name in tar.getnames())


def test_a_checkpoint_download_with_a_bad_token_is_a_401_and_without_one_the_login_page(checkpoint, annotator):
    url = reverse("checkpoint-download", args=[checkpoint.run.pk, 1])
    bad = Client().get(url, HTTP_AUTHORIZATION="Bearer rft_04_nope")
    assert bad.status_code == 401 and bad.json()["error"] == "invalid API token"
    assert Client().get(url).status_code == 302  # the login page, as before
    # the token of a user without the researcher role: the page's own 403
    assert Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token_for(annotator)}").status_code == 403
