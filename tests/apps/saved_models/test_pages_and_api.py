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
from apps.saved_models.models import MAX_NOTE, SavedModel
from apps.tasksets.models import Taskset
from workers.rft.config import RunConfig

pytestmark = pytest.mark.django_db


def full_config(**sections) -> dict:
    """A run's config as a launch stores it: every key, the models' paths absolute."""
    config = RunConfig.from_dict(sections).to_dict()
    config["model"]["path"] = "/data/models/base"
    return config


@pytest.fixture
def checkpointed(make_run):
    run = make_run("warm up", status=Run.Status.COMPLETED, config=full_config(
        algorithm={"name": "grpo"}, trainer={"lr": 3e-6}, buffer={"taskset": "sums"}))
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


def test_train_from_it_opens_the_source_runs_settings_on_the_model_and_a_preset_keeps_it(
        researcher_client, checkpointed, researcher):
    Run.objects.filter(pk=checkpointed.pk).update(config={**checkpointed.config, "model": {
        **checkpointed.config["model"], "ref_path": "/data/models/base", "critic_path": "/data/models/critic"}})
    services.save_model(checkpointed, 5, "warm", researcher)
    page = researcher_client.get(reverse("run-launch"), {"model": "warm"})
    form = page.context["form"]
    assert form["model.path"].value() == "models/warm" and page.context["preset_name"] is None
    assert form["trainer.lr"].value() == 3e-6 and form["algorithm.name"].value() == "grpo"  # not the preset's 1e-6
    assert form["buffer.taskset"].value() == "sums"
    assert "The settings of run <bdi>warm up</bdi>, which warm was saved from" in page.content.decode()
    config, _, _ = services.train_from(SavedModel.objects.get())
    # The reference follows the model it trains (empty: model.path); a critic of its own stays.
    assert config["model"]["ref_path"] is None and config["model"]["critic_path"] == "/data/models/critic"
    assert "models/warm" in form.fields["model.path"].suggestions
    assert "?preset=sft&amp;model=warm" in page.content.decode()
    sft = researcher_client.get(reverse("run-launch"), {"model": "warm", "preset": "sft"}).context["form"]
    assert sft["model.path"].value() == "models/warm" and sft["algorithm.name"].value() == "sft"
    # The run's heading names it as its user did, linked (its Config shows the path as stored).
    directory = str(services.model_dir(SavedModel.objects.get()))
    trained = Run.objects.create(name="grpo", owner=researcher, config={"model": {"path": directory}})
    page = researcher_client.get(reverse("run-detail", args=[trained.pk])).content.decode()
    heading = page[page.index('class="run-meta'):].split("</p>")[0]
    link = f'href="{reverse("model-list")}#model-warm"><bdi>models/warm</bdi></a>'
    assert link in heading and directory not in heading


def test_train_from_an_sft_warm_up_opens_grpo_on_its_taskset_and_a_deleted_source_says_so(
        researcher_client, checkpointed, researcher):
    Taskset.objects.create(name="sums")
    Run.objects.filter(pk=checkpointed.pk).update(config=full_config(
        mode="train", algorithm={"name": "sft"}, trainer={"lr": 1e-5},
        buffer={"taskset": "sums", "expert_taskset": "sums"}, explorer={"use_chat_template": False}))
    services.save_model(checkpointed, 5, "warm", researcher)
    page = researcher_client.get(reverse("run-launch"), {"model": "warm"})
    form = page.context["form"]
    assert form["algorithm.name"].value() == "grpo" and page.context["preset_name"] == "smollm2-grpo"
    assert form["model.path"].value() == "models/warm" and form["buffer.taskset"].value() == "sums"
    # The prompt format it learnt, and the model's settings, over the preset's.
    config, _, _ = services.train_from(SavedModel.objects.get())
    assert config["explorer"]["use_chat_template"] is False and config["explorer"]["system_prompt"] is None
    said = "warm is an SFT warm-up (run <bdi>warm up</bdi>): the form opens GRPO from it on <bdi>sums</bdi>"
    assert said in page.content.decode()

    checkpointed.delete()
    page = researcher_client.get(reverse("run-launch"), {"model": "warm"})
    assert page.context["form"]["model.path"].value() == "models/warm"
    assert page.context["preset_name"] == "smollm2-grpo"
    assert "warm was saved from run <bdi>warm up</bdi>, which is deleted" in page.content.decode()


def test_a_stale_model_link_opens_the_form_with_no_model_and_says_so(researcher_client, researcher):
    page = researcher_client.get(reverse("run-launch"), {"model": "gone"})
    form = page.context["form"]
    assert form["model.path"].value() == ""
    assert "No saved model named <bdi>gone</bdi> (deleted?)" in page.content.decode()
    # Launch with what it shows is refused: it trains no other model in its place.
    fields = {field.name: "" if field.value() is None else str(field.value()) for field in form
              if field.widget_type != "checkbox" or field.value()}
    refused = researcher_client.post(reverse("run-launch"), {key: ("on" if value == "True" else value)
                                                             for key, value in fields.items()})
    assert refused.status_code == 200 and refused.context["form"]["model.path"].errors
    assert not Run.objects.exists()


def test_a_model_deleted_meanwhile_is_said_so_on_delete_and_download(researcher_client, client, researcher):
    response = researcher_client.post(reverse("model-delete", args=["gone"]), follow=True)
    assert response.redirect_chain == [(reverse("model-list"), 302)]
    assert "Model <bdi>gone</bdi> was already deleted." in response.content.decode()
    download = researcher_client.get(reverse("model-download", args=["gone"]))
    assert download.status_code == 404 and b"No saved model named gone (deleted?)" in download.content
    refused = api(client, researcher, "delete", reverse("api-model", args=["gone"]))
    assert refused.status_code == 404 and refused.json()["error"] == "no saved model named gone (already deleted?)"


def test_trained_from_it_lists_every_run_that_loads_the_model(researcher_client, client, checkpointed, researcher):
    saved = services.save_model(checkpointed, 5, "warm", researcher)
    other = services.save_model(checkpointed, 5, "warm2", researcher)
    directory = str(services.model_dir(saved))
    uses = {"policy": {"model": {"path": directory}}, "reference": {"model": {"ref_path": directory}},
            "critic": {"model": {"critic_path": directory}},
            "judge": {"explorer": {"reward_fn": {"reward_model": {"model": directory}}}},
            "other": {"model": {"path": str(services.model_dir(other))}}}
    runs = {name: Run.objects.create(name=name, owner=researcher, config=config) for name, config in uses.items()}
    assert services.runs_naming([saved, other]) == {
        saved.pk: [runs[name] for name in ("policy", "reference", "critic", "judge")], other.pk: [runs["other"]]}
    row = researcher_client.get(reverse("model-list")).content.decode().split('id="model-warm"')[1].split("</tr>")[0]
    assert all(f">{name}</bdi>" in row for name in ("policy", "reference", "critic", "judge")) and "other" not in row
    listed = api(client, researcher, "get", reverse("api-models")).json()["results"]
    assert {model["name"]: model["trained_from_it"] for model in listed} == {
        "warm": [runs[name].pk for name in ("policy", "reference", "critic", "judge")], "warm2": [runs["other"].pk]}


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
    assert {key: listed[key] for key in ("count", "page", "pages")} == {"count": 1, "page": 1, "pages": 1}
    listed = listed["results"]
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


def test_the_list_pages_as_every_api_list_and_a_long_note_is_refused_by_form_and_api(
        client, researcher_client, checkpointed, researcher):
    for name in ("a", "b", "c"):
        services.save_model(checkpointed, 5, name, researcher)
    path = reverse("api-models")
    second = api(client, researcher, "get", f"{path}?page=2&page_size=2").json()
    assert (second["count"], second["page"], second["pages"]) == (3, 2, 2)
    assert [model["name"] for model in second["results"]] == ["a"]  # newest first
    refused = api(client, researcher, "get", f"{path}?page_size=0")
    assert refused.status_code == 400 and "page_size" in refused.json()["error"]

    long = "n" * (MAX_NOTE + 1)
    refused = api(client, researcher, "post", path, {"run": checkpointed.pk, "version": 5, "name": "d", "note": long})
    says = f"a note is at most {MAX_NOTE} characters: this one has {MAX_NOTE + 1}"
    assert refused.status_code == 400 and refused.json()["error"] == says
    assert refused.json()["errors"] == [{"key": "note", "message": says}]
    form = researcher_client.post(reverse("model-save", args=[checkpointed.pk, 5]), {"name": "d", "note": long})
    assert form.status_code == 200 and form.context["form"].errors == {"note": [says]}
    assert not SavedModel.objects.filter(name="d").exists() and not (services.models_root() / "d").exists()
    made = api(client, researcher, "post", path, {"run": checkpointed.pk, "version": 5, "name": "d",
                                                 "note": long[:MAX_NOTE]})
    assert made.status_code == 201 and made.json()["note"] == long[:MAX_NOTE]
