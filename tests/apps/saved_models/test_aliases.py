"""Aliases (MLflow's "champion" and "challenger"): one of an owner's models carries each, so
setting one moves it (said so); shown and filtered on the list, shown on the model page, in
/api/models/; each refusal names its problem and changes nothing; who saved it and curators only."""
import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.roles import RESEARCHER
from apps.accounts.services import create_user
from apps.saved_models import naming, services
from apps.saved_models.models import ModelAlias, SavedModel

from .test_pages_and_api import api, checkpointed  # noqa: F401 (a fixture)
from .test_rename import flashes

pytestmark = pytest.mark.django_db


@pytest.fixture
def two(checkpointed, researcher):  # noqa: F811
    return (services.save_model(checkpointed, 5, "first", researcher),
            services.save_model(checkpointed, 5, "second", researcher))


def aliases() -> dict[str, list[str]]:
    return {saved.name: list(saved.aliases.values_list("name", flat=True)) for saved in SavedModel.objects.all()}


def test_setting_an_alias_on_one_model_moves_it_from_the_other_and_says_so(researcher_client, two):
    set_first = researcher_client.post(reverse("model-alias", args=["first"]), {"alias": "champion"}, follow=True)
    assert flashes(set_first) == ["\u2068first\u2069 is champion now."]
    assert 'class="chip tag alias"' in set_first.content.decode() and ">champion</a>" in set_first.content.decode()
    moved = researcher_client.post(reverse("model-alias", args=["second"]), {"alias": "champion"}, follow=True)
    assert flashes(moved) == ["\u2068second\u2069 is champion now, moved from \u2068first\u2069, which is no longer "
                              "champion."]
    researcher_client.post(reverse("model-alias", args=["first"]), {"alias": "challenger"})
    assert aliases() == {"first": ["challenger"], "second": ["champion"]}

    # The list shows each model's and filters by one; its header links keep the filter.
    listing = researcher_client.get(reverse("model-list")).content.decode()
    row = listing.split('id="model-second"')[1].split("</tr>")[0]
    assert 'href="?alias=champion"' in row and 'href="/models/second/"' in row
    assert "Alias: <strong>all models</strong>" in listing
    champions = researcher_client.get(reverse("model-list"), {"alias": "champion"})
    assert [model.name for model in champions.context["models"]] == ["second"]
    assert "<strong>champion</strong>" in champions.content.decode()
    nobody = researcher_client.get(reverse("model-list"), {"alias": "retired"})
    assert list(nobody.context["models"]) == [] and "No model is retired" in nobody.content.decode()

    removed = researcher_client.post(reverse("model-alias", args=["second"]), {"remove": "champion"}, follow=True)
    assert flashes(removed) == ["\u2068second\u2069 is no longer \u2068champion\u2069."]
    again = researcher_client.post(reverse("model-alias", args=["second"]), {"remove": "champion"}, follow=True)
    assert "was not \u2068champion\u2069 (taken off meanwhile?)" in flashes(again)[0]
    assert aliases() == {"first": ["challenger"], "second": []}


@pytest.mark.parametrize("alias, problem", [
    ("", "an alias is required: it was empty"),
    ("Champion", "lower-case letters"),
    ("champ ion", "lower-case letters"),
    ("x" * 33, "1 to 32"),
    ("champion\u200b", "invisible character (U+200B)"),
    ("champion\x00x", "control character (U+0000)"),
])
def test_a_bad_alias_is_refused_naming_the_problem_and_nothing_changes(researcher_client, two, alias, problem):
    naming.set_alias(two[0], "champion", two[0].created_by)
    done = researcher_client.post(reverse("model-alias", args=["second"]), {"alias": alias}, follow=True)
    assert any(message.startswith("No alias set: ") and problem in message for message in flashes(done))
    assert aliases() == {"first": ["champion"], "second": []}
    with pytest.raises(services.SaveError, match="first is champion already"):
        naming.set_alias(two[0], "champion", two[0].created_by)


def test_an_alias_is_unique_per_owner_and_only_its_saver_and_curators_set_it(client, two, curator, checkpointed):  # noqa: F811
    other = create_user("other-res", "pw-for-tests-123", roles=[RESEARCHER])
    theirs = services.save_model(checkpointed, 5, "theirs", other)
    naming.set_alias(two[0], "champion", two[0].created_by)
    assert naming.set_alias(theirs, "champion", other) is None  # another owner's: both keep theirs
    assert aliases() == {"first": ["champion"], "second": [], "theirs": ["champion"]}

    client.force_login(other)
    page = client.get(reverse("model-detail", args=["first"]))
    assert page.status_code == 200 and 'id="alias-form"' not in page.content.decode()
    assert client.post(reverse("model-alias", args=["second"]), {"alias": "champion"}).status_code == 403
    assert client.post(reverse("model-alias", args=["first"]), {"remove": "champion"}).status_code == 403
    refused = api(Client(), other, "post", reverse("api-model-aliases", args=["second"]), {"alias": "champion"})
    assert refused.status_code == 403
    assert aliases() == {"first": ["champion"], "second": [], "theirs": ["champion"]}

    # A curator's change is the saver's alias: it moves among the saver's models.
    moved = api(Client(), curator, "post", reverse("api-model-aliases", args=["second"]), {"alias": "champion"})
    assert moved.status_code == 200 and moved.json() == {"model": "second", "alias": "champion", "moved_from": "first"}
    assert ModelAlias.objects.get(model__name="second").owner == two[1].created_by
    assert aliases() == {"first": [], "second": ["champion"], "theirs": ["champion"]}


def test_the_api_lists_aliases_filters_by_one_and_sets_and_removes_them(two, researcher):
    http = Client()
    assert api(http, researcher, "post", reverse("api-model-aliases", args=["first"]),
               {"alias": "champion"}).json()["moved_from"] is None
    for body, problem in [({"alias": "Bad"}, "lower-case"), ({"alias": 3}, "alias must be a string"),
                          ({"alis": "x"}, "alis")]:
        refused = api(http, researcher, "post", reverse("api-model-aliases", args=["first"]), body)
        assert refused.status_code == 400 and problem in refused.json()["error"], refused.json()
    listed = api(http, researcher, "get", reverse("api-models")).json()["results"]
    assert {model["name"]: model["aliases"] for model in listed} == {"first": ["champion"], "second": []}
    filtered = api(http, researcher, "get", reverse("api-models") + "?alias=champion").json()
    assert [model["name"] for model in filtered["results"]] == ["first"] and filtered["count"] == 1
    gone = api(http, researcher, "delete", reverse("api-model-alias", args=["first", "champion"]))
    assert gone.status_code == 204
    assert api(http, researcher, "delete", reverse("api-model-alias", args=["first", "champion"])).status_code == 404
    assert aliases() == {"first": [], "second": []}


def test_deleting_an_owner_deletes_their_aliases_and_keeps_their_models_which_may_be_aliased_anew(
        checkpointed):  # noqa: F811
    one, other = (create_user(name, "pw-for-tests-123", roles=[RESEARCHER]) for name in ("one-res", "other-res"))
    mine = services.save_model(checkpointed, 5, "mine", one)
    theirs = services.save_model(checkpointed, 5, "theirs", other)
    naming.set_alias(mine, "champion", one)
    naming.set_alias(theirs, "champion", other)
    # Two owners' "champion"s: kept unowned (SET_NULL), the second deletion would collide.
    one.delete()
    other.delete()
    assert ModelAlias.objects.count() == 0
    assert sorted(SavedModel.objects.filter(created_by=None).values_list("name", flat=True)) == ["mine", "theirs"]
    curator = create_user("cur2", "pw-for-tests-123", roles=["curator"])
    naming.set_alias(SavedModel.objects.get(name="mine"), "champion", curator)
    assert naming.set_alias(SavedModel.objects.get(name="theirs"), "champion", curator).name == "mine"
    assert aliases() == {"mine": [], "theirs": ["champion"]}
