"""Renaming a saved model (its page's form and PATCH /api/models/<name>/): its directory moves with
it; a run that would still load it by its old path blocks the rename, a finished one stays listed
under it; each refusal names its problem and changes nothing; who saved it and curators only."""
import json

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.runs.models import Run
from apps.saved_models import naming, services
from apps.saved_models.models import SavedModel

from .test_pages_and_api import api, checkpointed  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def flashes(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def loading(make_run, saved, status, mode="both"):
    """A run whose config names the model's directory, as a launch stores it."""
    return make_run(f"{status} from {saved.name}", status=status,
                    config={"mode": mode, "model": {"path": str(services.model_dir(saved))}})


@pytest.fixture
def warm(checkpointed, researcher):  # noqa: F811
    return services.save_model(checkpointed, 5, "warm", researcher, "five steps")


def test_the_owner_renames_it_on_its_page_and_its_directory_old_links_and_finished_runs_follow(
        researcher_client, warm, make_run):
    old_dir = services.model_dir(warm)
    finished = loading(make_run, warm, Run.Status.COMPLETED)
    page = researcher_client.get(reverse("model-detail", args=["warm"]))
    assert page.status_code == 200 and 'id="rename-form"' in page.content.decode()

    done = researcher_client.post(reverse("model-rename", args=["warm"]), {"name": " warm-v2 "}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("model-detail", args=["warm-v2"])
    assert flashes(done)[0].startswith("Renamed \u2068warm\u2069 to \u2068warm-v2\u2069")
    saved = SavedModel.objects.get()
    assert (saved.name, saved.former_names, saved.note) == ("warm-v2", ["warm"], "five steps")
    assert not old_dir.exists() and (services.model_dir(saved) / "model.safetensors").exists()
    assert json.loads((services.model_dir(saved) / services.PROVENANCE).read_text())["name"] == "warm-v2"
    # The run that loaded it as models/warm is still one trained from it, on its page and the list.
    assert [run.pk for run in services.runs_naming([saved])[saved.pk]] == [finished.pk]
    assert f'href="{reverse("run-detail", args=[finished.pk])}"' in done.content.decode()
    assert "Formerly <code><bdi>warm</bdi></code>" in done.content.decode()
    listing = researcher_client.get(reverse("model-list")).content.decode()
    assert 'id="model-warm-v2"' in listing and 'id="model-warm"' not in listing
    # A bookmark of the old page lands on the new one, said so; the launch form offers the new path.
    old = researcher_client.get(reverse("model-detail", args=["warm"]), follow=True)
    assert old.redirect_chain == [(reverse("model-detail", args=["warm-v2"]), 302)]
    assert "\u2068warm\u2069 was renamed \u2068warm-v2\u2069." in flashes(old)
    launch = researcher_client.get(reverse("run-launch"), {"model": "warm-v2"})
    assert launch.context["form"]["model.path"].value() == "models/warm-v2"
    # So do Train from it and Evaluate links from before the rename, said so.
    for key, mode in (("model", "both"), ("evaluate", "bench")):
        stale = researcher_client.get(reverse("run-launch"), {key: "warm"})
        form = stale.context["form"]
        assert (form["model.path"].value(), form["mode"].value()) == ("models/warm-v2", mode)
        assert "Model \u2068warm\u2069 was renamed \u2068warm-v2\u2069: the form names it so." in flashes(stale)
    # Renamed back, the old name is its own again: no other model's.
    naming.rename_model(saved, "warm", saved.created_by)
    assert (SavedModel.objects.get().name, SavedModel.objects.get().former_names) == ("warm", ["warm-v2"])


@pytest.mark.parametrize("name, problem", [
    ("", "a model&#x27;s name is required: it was empty"),
    ("   ", "a model&#x27;s name is required: it was empty"),
    ("WARM-taken", "a saved model is already named &#x27;warm-taken&#x27; (names that differ in case only are"),
    ("warm\u200b", "holds an invisible character (U+200B)"),
    ("warm\u202e", "holds an invisible character (U+202E)"),
    ("warm\x1b", "holds a control character (U+001B)"),
    ("warm", "warm</bdi> is its name already: nothing renamed"),
    ("no spaces", "1 to 100 letters"),
    ("tiny", "a built-in model&#x27;s name"),
])
def test_a_bad_new_name_is_refused_naming_the_problem_and_nothing_changes(
        researcher_client, warm, researcher, name, problem):
    services.save_model(warm.run, 5, "warm-taken", researcher)
    done = researcher_client.post(reverse("model-rename", args=["warm"]), {"name": name}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("model-detail", args=["warm"])
    said = done.content.decode()
    assert ("Not renamed: " in said or name == "warm") and problem in said
    assert sorted(SavedModel.objects.values_list("name", flat=True)) == ["warm", "warm-taken"]
    assert SavedModel.objects.get(name="warm").former_names == []
    assert services.model_dir(warm).exists()


def test_a_former_name_of_another_model_is_taken(warm, researcher):
    other = services.save_model(warm.run, 5, "other", researcher)
    naming.rename_model(warm, "warm-v2", researcher)
    with pytest.raises(services.SaveError, match="was saved model 'warm-v2''s name until it was renamed"):
        naming.rename_model(other, "Warm", researcher)
    with pytest.raises(services.SaveError, match="was saved model 'warm-v2''s name"):
        services.save_model(warm.run, 5, "warm", researcher)  # a save too: runs name that directory
    assert SavedModel.objects.get(pk=other.pk).name == "other"


@pytest.mark.parametrize("status", [Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.STOPPED, Run.Status.FAILED])
def test_a_run_that_would_still_load_it_by_its_path_blocks_the_rename(researcher_client, warm, make_run, status):
    run = loading(make_run, warm, status)
    done = researcher_client.post(reverse("model-rename", args=["warm"]), {"name": "warm-v2"}, follow=True)
    said = done.content.decode()
    assert f"Not renamed: run {run.name} (#{run.pk}, {status}) names models/warm and would load it" in said
    assert SavedModel.objects.get().name == "warm" and services.model_dir(warm).exists()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    naming.rename_model(SavedModel.objects.get(), "warm-v2", warm.created_by)  # once it completed


def test_only_its_saver_and_curators_rename_it_on_the_page_and_the_api(client, warm, curator, make_run):
    other = create_user("other-res", "pw-for-tests-123", roles=[RESEARCHER])
    client.force_login(other)
    page = client.get(reverse("model-detail", args=["warm"]))
    assert page.status_code == 200 and 'id="rename-form"' not in page.content.decode()
    assert client.post(reverse("model-rename", args=["warm"]), {"name": "mine"}).status_code == 403
    refused = api(Client(), other, "patch", reverse("api-model", args=["warm"]), {"name": "mine"})
    assert refused.status_code == 403 and "who saved warm, or a curator" in refused.json()["error"]
    assert SavedModel.objects.get().name == "warm"

    renamed = api(Client(), curator, "patch", reverse("api-model", args=["warm"]), {"name": "by-curator"})
    assert renamed.status_code == 200
    body = renamed.json()
    assert (body["name"], body["former_names"], body["model_path"]) == ("by-curator", ["warm"], "models/by-curator")
    assert SavedModel.objects.get().name == "by-curator"


def test_the_api_refuses_a_bad_name_400_and_a_loading_run_409_and_a_missing_model_404(warm, researcher, make_run):
    url = reverse("api-model", args=["warm"])
    for body, problem in [({"name": ""}, "a model's name is required"), ({"name": 7}, "name must be a string"),
                          ({"name": "x\u200b"}, "invisible character"), ({"nam": "x"}, "nam")]:
        refused = api(Client(), researcher, "patch", url, body)
        assert refused.status_code == 400 and problem in refused.json()["error"], refused.json()
    loading(make_run, warm, Run.Status.QUEUED)
    blocked = api(Client(), researcher, "patch", url, {"name": "warm-v2"})
    assert blocked.status_code == 409 and "names models/warm and would load it" in blocked.json()["error"]
    gone = api(Client(), researcher, "patch", reverse("api-model", args=["gone"]), {"name": "x"})
    assert gone.status_code == 404
    assert SavedModel.objects.get().name == "warm"


def test_a_rename_that_lost_to_another_is_a_conflict_naming_the_winner(warm, researcher):
    # Two renames of one model at once: the second read the row before the first committed.
    first, second = SavedModel.objects.get(), SavedModel.objects.get()
    naming.rename_model(first, "n0a", researcher)
    with pytest.raises(services.SaveError, match="^warm was renamed meanwhile to n0a$") as refused:
        naming.rename_model(second, "n0b", researcher)
    assert refused.value.conflict and second.name == "warm"
    assert SavedModel.objects.get().name == "n0a" and (services.models_root() / "n0a").is_dir()
    assert not (services.models_root() / "n0b").exists()


def test_the_rename_form_posted_after_another_renamed_it_lands_on_its_page_under_its_new_name(
        researcher_client, warm, researcher):
    naming.rename_model(SavedModel.objects.get(), "by-another", researcher)  # in another tab
    done = researcher_client.post(reverse("model-rename", args=["warm"]), {"name": "mine"}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("model-detail", args=["by-another"])
    assert flashes(done) == ["Not renamed: \u2068warm\u2069 was renamed meanwhile to \u2068by-another\u2069."]
    assert SavedModel.objects.get().name == "by-another"


def test_the_rename_says_runs_that_loaded_it_are_still_listed_only_when_some_did(
        researcher_client, warm, make_run):
    done = researcher_client.post(reverse("model-rename", args=["warm"]), {"name": "warm-v2"}, follow=True)
    assert flashes(done) == ["Renamed \u2068warm\u2069 to \u2068warm-v2\u2069: a run names it as model.path "
                             "\u2068models/warm-v2\u2069 now."]
    loading(make_run, SavedModel.objects.get(), Run.Status.COMPLETED)
    again = researcher_client.post(reverse("model-rename", args=["warm-v2"]), {"name": "warm-v3"}, follow=True)
    assert "the runs that loaded it as models/\u2068warm-v2\u2069 are still listed" in flashes(again)[0]


@pytest.mark.parametrize("name", ["TINY", "Tiny", "SmolLM2-135M"])
def test_a_built_in_models_name_is_taken_in_any_case(warm, researcher, name):
    with pytest.raises(services.SaveError, match="is a built-in model's name \\(names that differ in case only"):
        naming.rename_model(SavedModel.objects.get(), name, researcher)
    assert services.name_problem("tiny") == "'tiny' is a built-in model's name"


def test_the_api_gets_one_model_as_the_list_gives_it_and_a_former_name_says_the_new_one(
        warm, researcher, make_run):
    loading(make_run, warm, Run.Status.COMPLETED)
    one = api(Client(), researcher, "get", reverse("api-model", args=["warm"]))
    assert one.status_code == 200
    assert one.json() == api(Client(), researcher, "get", reverse("api-models")).json()["results"][0]
    naming.rename_model(SavedModel.objects.get(), "warm-v2", researcher)
    gone = api(Client(), researcher, "get", reverse("api-model", args=["warm"]))
    assert gone.status_code == 404 and gone.json()["error"] == "no saved model named warm (renamed to warm-v2)"
    assert Client().get(reverse("api-model", args=["warm-v2"])).status_code == 401
