"""The Models page, the save form, the launch form's ?model= and the API's /api/models/: each
refusal names its problem and saves or deletes nothing."""
import json
import shutil

import pytest
from django.urls import reverse

from apps.runs.api import token_for
from apps.runs.live import checkpoints_update
from apps.runs.models import Checkpoint, Run
from apps.runs.supervision import run_dir
from apps.saved_models import services
from apps.saved_models.models import SavedModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpointed(make_run):
    run = make_run("warm up", status=Run.Status.COMPLETED)
    directory = run_dir(run) / "checkpoints" / "step_5"
    directory.mkdir(parents=True)
    for name, content in {"config.json": "{}", "model.safetensors": "w" * 100, "optimizer.pt": "adam"}.items():
        (directory / name).write_text(content)
    Checkpoint.objects.create(run=run, version=5, step=5, path=str(directory))
    yield run
    shutil.rmtree(run_dir(run), ignore_errors=True)
    for saved in SavedModel.objects.all():
        shutil.rmtree(services.model_dir(saved), ignore_errors=True)


def api(client, user, method: str, path: str, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token_for(user)}"}
    return getattr(client, method)(path, json.dumps(body) if body is not None else None,
                                   content_type="application/json", **headers)


def test_the_save_form_offers_a_name_and_refuses_a_bad_one_in_place(researcher_client, checkpointed):
    url = reverse("model-save", args=[checkpointed.pk, 5])
    form = researcher_client.get(url).context["form"]
    assert form["name"].value() == f"warm-up-{checkpointed.pk}-v5"
    refused = researcher_client.post(url, {"name": "no spaces please", "note": ""})
    assert refused.status_code == 200 and "1 to 100 letters" in refused.context["form"].errors["name"][0]
    assert not SavedModel.objects.exists()
    assert researcher_client.get(reverse("model-save", args=[checkpointed.pk, 6])).status_code == 404

    saved = researcher_client.post(url, {"name": "warm", "note": "five steps"})
    assert saved.status_code == 302 and saved.url == reverse("model-list")
    listing = researcher_client.get(reverse("model-list")).content.decode()
    assert 'id="model-warm"' in listing and "five steps" in listing and "step 5" in listing
    assert checkpoints_update(checkpointed.pk)["checkpoints"] == [{
        "version": 5, "step": 5, "saved": pytest.approx(Checkpoint.objects.get().created_at.timestamp(), abs=0.01),
        "url": reverse("checkpoint-download", args=[checkpointed.pk, 5]), "save_url": url, "models": ["warm"],
    }]
    assert "saved as warm" in researcher_client.get(reverse("run-detail", args=[checkpointed.pk])).content.decode()


def test_train_from_it_opens_the_launch_form_on_the_model_and_a_preset_keeps_it(researcher_client, checkpointed,
                                                                               researcher):
    services.save_model(checkpointed, 5, "warm", researcher)
    page = researcher_client.get(reverse("run-launch"), {"model": "warm"})
    assert page.context["form"]["model.path"].value() == "models/warm" and page.context["preset_name"] == "smollm2-grpo"
    assert "models/warm" in page.context["form"].fields["model.path"].suggestions
    assert "?preset=sft&amp;model=warm" in page.content.decode()
    sft = researcher_client.get(reverse("run-launch"), {"model": "warm", "preset": "sft"}).context["form"]
    assert sft["model.path"].value() == "models/warm" and sft["algorithm.name"].value() == "sft"
    unknown = researcher_client.get(reverse("run-launch"), {"model": "nope"}).context["form"]
    assert unknown["model.path"].value() == "tiny"  # the default preset's, as with no ?model=
    # The run's heading names it as its user did, linked (its Config shows the path as stored).
    directory = str(services.model_dir(SavedModel.objects.get()))
    trained = Run.objects.create(name="grpo", owner=researcher, config={"model": {"path": directory}})
    page = researcher_client.get(reverse("run-detail", args=[trained.pk])).content.decode()
    heading = page[page.index('class="run-meta'):].split("</p>")[0]
    link = f'href="{reverse("model-list")}#model-warm"><bdi>models/warm</bdi></a>'
    assert link in heading and directory not in heading


def test_the_api_saves_lists_and_deletes_and_refuses_by_name(client, checkpointed, researcher, curator):
    path = reverse("api-models")
    for body, status, says in [
        ({"run": checkpointed.pk}, 400, "version must be a whole number"),
        ({"run": checkpointed.pk, "version": "5"}, 400, "version must be a whole number"),
        ({"run": checkpointed.pk, "version": 5, "name": 7}, 400, "name must be a string"),
        ({"run": checkpointed.pk, "version": 5, "note": "a\x00b"}, 400, "note must not contain a NUL"),
        ({"run": checkpointed.pk, "version": 5, "nmae": "x"}, 400, "nmae"),
        ({"run": checkpointed.pk, "version": 9}, 404, "has no checkpoint v9"),
        ({"run": 10**9, "version": 5}, 404, ""),
        ({"run": checkpointed.pk, "version": 5, "name": "../up"}, 400, "1 to 100 letters"),
    ]:
        response = api(client, researcher, "post", path, body)
        assert response.status_code == status and says in response.json()["error"], (body, response.json())
    assert not SavedModel.objects.exists()

    made = api(client, researcher, "post", path, {"run": checkpointed.pk, "version": 5, "note": "n"})
    assert made.status_code == 201 and made.json()["name"] == f"warm-up-{checkpointed.pk}-v5"
    name = made.json()["name"]
    assert made.json()["model_path"] == f"models/{name}" and made.json()["size_bytes"] == 102  # no optimizer
    listed = api(client, researcher, "get", path).json()
    assert [model["name"] for model in listed] == [name] and listed[0]["run"] == checkpointed.pk
    download = client.get(listed[0]["download_url"], HTTP_AUTHORIZATION=f"Bearer {token_for(researcher)}")
    assert download.status_code == 200 and b"model.safetensors" in b"".join(download)

    Run.objects.create(name="queued", owner=researcher, status=Run.Status.QUEUED,
                       config={"model": {"path": str(services.model_dir(SavedModel.objects.get()))}})
    refused = api(client, curator, "delete", reverse("api-model", args=[name]))
    assert refused.status_code == 409 and "run queued" in refused.json()["error"]
    Run.objects.filter(name="queued").update(status=Run.Status.COMPLETED)
    assert api(client, curator, "delete", reverse("api-model", args=[name])).status_code == 204
    assert not SavedModel.objects.exists()
    assert api(client, curator, "delete", reverse("api-model", args=[name])).status_code == 404
