"""A saved model's name is unique in any case in the database too (SavedModel's constraint on
Lower(name)): a save or rename that passed services.name_problem before another's save of the name
(or of it in another case) committed is refused by the database, and says so as the check would
have: the same 400 or form error, nothing saved, renamed or moved."""
import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse

from apps.saved_models import services
from apps.saved_models.models import SavedModel
from tests.support import migrate_to, migrate_to_newest

from .test_pages_and_api import api, checkpointed  # noqa: F401 (a fixture)
from .test_rename import flashes

pytestmark = pytest.mark.django_db
IN_CASE = "a saved model is already named 'Warm' (names that differ in case only are one name)"


def row(run, name: str) -> SavedModel:
    return SavedModel.objects.create(name=name, run=run, run_name=run.name, checkpoint_version=5, step=5)


@pytest.mark.parametrize("other", ["Warm", "WARM", "warm"])
def test_the_database_refuses_a_second_name_that_differs_in_case_only(checkpointed, other):  # noqa: F811
    row(checkpointed, "warm")
    with pytest.raises(IntegrityError), transaction.atomic():
        row(checkpointed, other)
    renamed = row(checkpointed, "cold")
    renamed.name = other
    with pytest.raises(IntegrityError), transaction.atomic():
        renamed.save(update_fields=["name"])
    renamed.name = "Cold"  # its own name in another case: the one row, no clash
    renamed.save(update_fields=["name"])
    assert sorted(SavedModel.objects.values_list("name", flat=True)) == ["Cold", "warm"]


@pytest.fixture
def saved_meanwhile(checkpointed, researcher, monkeypatch):  # noqa: F811
    """Makes the next name check race with another researcher's save of `other`: that save
    commits (services.save_model, whole) right after the check passed, before this one writes."""
    check = services.name_problem

    def race(other: str):
        def checked_then_saved(name, instead_of=None):
            problem = check(name, instead_of)
            monkeypatch.setattr(services, "name_problem", check)  # the other's save checks as usual
            services.save_model(checkpointed, 5, other, researcher)
            return problem

        monkeypatch.setattr(services, "name_problem", checked_then_saved)

    return race


def model_dirs() -> list[str]:
    """This test's directories under models/, a save's temporary ones (.warm.<hex>) too; other
    tests' (models/tiny) are not its to count."""
    root = services.models_root()
    mine = ("warm", "cold", ".warm.", ".cold.")
    return sorted(path.name for path in root.iterdir() if path.name.lower().startswith(mine)) if root.exists() else []


@pytest.mark.parametrize("other, said", [("Warm", IN_CASE), ("warm", "a saved model is already named 'warm'")])
def test_a_save_that_lost_the_race_is_the_checks_400_and_saves_nothing(
        checkpointed, researcher, saved_meanwhile, other, said):  # noqa: F811
    saved_meanwhile(other)
    refused = api(Client(), researcher, "post", reverse("api-models"),
                  {"run": checkpointed.pk, "version": 5, "name": "warm"})
    assert refused.status_code == 400, refused.json()
    assert refused.json()["error"] == said and refused.json()["errors"] == [{"key": "name", "message": said}]
    assert list(SavedModel.objects.values_list("name", flat=True)) == [other] and model_dirs() == [other]


def test_the_save_form_that_lost_the_race_says_so_in_place(researcher_client, checkpointed, saved_meanwhile):  # noqa: F811
    saved_meanwhile("Warm")
    refused = researcher_client.post(reverse("model-save", args=[checkpointed.pk, 5]), {"name": "warm", "note": ""})
    assert refused.status_code == 200 and refused.context["form"].errors["name"] == [IN_CASE]
    assert list(SavedModel.objects.values_list("name", flat=True)) == ["Warm"] and model_dirs() == ["Warm"]


def test_a_rename_that_lost_the_race_is_the_checks_400_and_moves_nothing(
        checkpointed, researcher, saved_meanwhile):  # noqa: F811
    services.save_model(checkpointed, 5, "cold", researcher)
    saved_meanwhile("Warm")
    refused = api(Client(), researcher, "patch", reverse("api-model", args=["cold"]), {"name": "warm"})
    assert refused.status_code == 400, refused.json()
    assert refused.json()["error"] == IN_CASE and refused.json()["errors"] == [{"key": "name", "message": IN_CASE}]
    cold = SavedModel.objects.get(name="cold")
    assert cold.former_names == [] and model_dirs() == ["Warm", "cold"]


def test_the_rename_form_that_lost_the_race_says_so(researcher_client, checkpointed, researcher, saved_meanwhile):  # noqa: F811
    services.save_model(checkpointed, 5, "cold", researcher)
    saved_meanwhile("Warm")
    done = researcher_client.post(reverse("model-rename", args=["cold"]), {"name": "warm"}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("model-detail", args=["cold"])
    assert flashes(done) == [f"Not renamed: {IN_CASE}"]
    assert SavedModel.objects.get(name="cold").former_names == [] and model_dirs() == ["Warm", "cold"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_names_models_whose_names_differ_in_case_only(researcher):
    old = migrate_to(("saved_models", "0002_renames_and_aliases"))
    Saved = old.get_model("saved_models", "SavedModel")
    for name in ("warm", "Warm", "cold"):
        Saved.objects.create(name=name, run_name="r", checkpoint_version=1, step=1)
    try:
        with pytest.raises(RuntimeError, match=r"differ in case only: Warm and warm\. Rename one of each"):
            migrate_to(("saved_models", "0003_name_unique_any_case"))
        Saved.objects.filter(name="Warm").update(name="warm-2")
        migrate_to(("saved_models", "0003_name_unique_any_case"))
        assert sorted(SavedModel.objects.values_list("name", flat=True)) == ["cold", "warm", "warm-2"]
    finally:
        SavedModel.objects.all().delete()
        migrate_to_newest()
