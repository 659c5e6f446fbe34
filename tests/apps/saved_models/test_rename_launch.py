"""A saved model's rename against the runs that name it: a launch and a rename take turns on the
model's row (neither leaves a run naming a directory moved away), a resume of a run naming a
former directory is refused naming the model's new name, renaming back mends it, and Launch
again of a run that loaded it before a rename opens the form on its new name. Real model files
(the built-in tiny model's), so each launch passes every check but the one under test."""
import os
import threading

import pytest
from django.test import Client
from django.urls import reverse

from apps.runs import services as run_services
from apps.runs.models import Run
from apps.saved_models import naming, services
from apps.saved_models.models import SavedModel
from apps.tasksets.services import load_builtin_tasksets

from ..runs.test_launch import posted
from .test_pages_and_api import api
from .test_rename import flashes
from .test_services import checkpointed  # noqa: F401 (a fixture)

CONFIG = {"algorithm": {"name": "grpo"}, "buffer": {"taskset": "addition"}, "explorer": {"use_chat_template": False}}


def launch_body(name: str, path: str) -> dict:
    return {"name": name, "config": {**CONFIG, "model": {"path": path}}}


@pytest.fixture
def hot(checkpointed, researcher):  # noqa: F811
    load_builtin_tasksets()
    return services.save_model(checkpointed[0], 2, "hot", researcher)


def dangling() -> list[str]:
    """Runs whose model.path is a directory that is not there."""
    return [run.name for run in Run.objects.all()
            if (path := run.config.get("model", {}).get("path")) and not os.path.isdir(path)]


def said(answer) -> str:
    """A 400's issues, as key: message."""
    return "; ".join(f"{error['key']}: {error['message']}" for error in answer.json()["errors"])


@pytest.mark.postgres("two connections at once: SQLite's test threads share one writer")
@pytest.mark.django_db(transaction=True)
def test_a_rename_that_goes_first_refuses_the_launch_that_checked_the_directory_before_it(
        hot, researcher, monkeypatch):
    validated, go, answers = threading.Event(), threading.Event(), {}
    validate = run_services.validate_config

    def slow_validate(config):  # the launch has seen models/hot; the rename goes before its run is created
        parsed = validate(config)
        validated.set()
        go.wait(10)
        return parsed

    monkeypatch.setattr(run_services, "validate_config", slow_validate)

    def launch():
        answers["launch"] = api(Client(), researcher, "post", reverse("api-runs"), launch_body("race0", "models/hot"))
        from django.db import connection
        connection.close()

    thread = threading.Thread(target=launch)
    thread.start()
    assert validated.wait(10)
    renamed = api(Client(), researcher, "patch", reverse("api-model", args=["hot"]), {"name": "hot2"})
    go.set()
    thread.join(20)
    assert renamed.status_code == 200
    assert answers["launch"].status_code == 400
    assert "model.path: models/hot was renamed to hot2: name models/hot2" in said(answers["launch"])
    assert not Run.objects.filter(name="race0").exists() and dangling() == []


@pytest.mark.postgres("two connections at once: SQLite's test threads share one writer")
@pytest.mark.django_db(transaction=True)
def test_a_launch_that_holds_the_model_makes_the_rename_wait_and_then_refuse_naming_its_run(
        hot, researcher, monkeypatch):
    locked, go, answers = threading.Event(), threading.Event(), {}
    lock_named = run_services.lock_named

    def held(paths):
        gone = lock_named(paths)
        locked.set()
        go.wait(10)
        return gone

    monkeypatch.setattr(run_services, "lock_named", held)

    def call(key, *args):
        answers[key] = api(Client(), researcher, *args)
        from django.db import connection
        connection.close()

    launch = threading.Thread(target=call, args=("launch", "post", reverse("api-runs"),
                                                 launch_body("race0", "models/hot")))
    launch.start()
    assert locked.wait(10)
    rename = threading.Thread(target=call, args=("rename", "patch", reverse("api-model", args=["hot"]),
                                                 {"name": "hot2"}))
    rename.start()
    rename.join(1)
    assert rename.is_alive()  # waiting for the launch's lock on the model's row
    go.set()
    launch.join(20)
    rename.join(20)
    assert answers["launch"].status_code == 201
    run = Run.objects.get(name="race0")
    assert answers["rename"].status_code == 409
    assert f"run race0 (#{run.pk}, queued) names models/hot and would load it" in answers["rename"].json()["error"]
    assert SavedModel.objects.get().name == "hot" and dangling() == []


@pytest.mark.django_db
def test_a_run_naming_a_former_directory_is_not_resumed_and_renaming_back_mends_it(hot, researcher, make_run):
    naming.rename_model(hot, "hot2", researcher)
    # Left so by the race before the launch took the lock (or by a run the worker failed on).
    stale = make_run("race0", status=Run.Status.FAILED, config={
        **CONFIG, "model": {"path": str(services.models_root() / "hot")}})
    refusal = (rf"^run {stale.pk} cannot be resumed: models/hot was renamed to hot2 since it launched: rename it back "
               r"to hot to resume this run, or Launch again \(the form names it models/hot2\)$")
    with pytest.raises(run_services.InvalidTransition, match=refusal):
        run_services.resume_run(stale)
    assert Run.objects.get(pk=stale.pk).status == Run.Status.FAILED
    removed = make_run("by hand", status=Run.Status.STOPPED, config={
        **CONFIG, "model": {"path": str(services.models_root() / "gone")}})
    with pytest.raises(run_services.InvalidTransition, match=rf"^run {removed.pk} cannot be resumed: no model "
                                                             r"directory at models/gone \(deleted since it launched"):
        run_services.resume_run(removed)
    # Its deletion is refused naming the directory the run names, not the model's name now.
    with pytest.raises(services.SaveError, match=rf"run race0 \(#{stale.pk}, failed\) names models/hot and"):
        services.delete_model(SavedModel.objects.get(), researcher)
    # Renaming back is allowed: only a run that could not load it anyway was in the way.
    back = api(Client(), researcher, "patch", reverse("api-model", args=["hot2"]), {"name": "hot"})
    assert back.status_code == 200 and back.json()["former_names"] == ["hot2"]
    run_services.resume_run(stale)
    assert Run.objects.get(pk=stale.pk).status == Run.Status.QUEUED


@pytest.mark.django_db
def test_launch_again_of_a_run_that_loaded_a_renamed_model_names_it_as_it_is_now(
        hot, researcher, researcher_client, make_run):
    finished = make_run("warm run", status=Run.Status.COMPLETED, config={
        **CONFIG, "model": {"path": str(services.models_root() / "hot"), "ref_path": None}})
    naming.rename_model(hot, "hot2", researcher)  # a finished run is not in its way
    page = researcher_client.get(reverse("run-launch"), {"from": finished.pk})
    assert "\u2068hot\u2069 was renamed \u2068hot2\u2069: the form names it so (model.path)." in " ".join(flashes(page))
    form = page.context["form"]
    assert form["model.path"].value() == "models/hot2"
    # Launched by the old name anyway (the form, the API): said as a rename, not as a deletion.
    refused = researcher_client.post(reverse("run-launch"), posted(form, **{"model.path": "models/hot"}))
    assert "models/hot was renamed to hot2: name models/hot2" in refused.content.decode()
    refused = api(Client(), researcher, "post", reverse("api-runs"), launch_body("again", "models/hot"))
    assert refused.status_code == 400
    assert "model.path: models/hot was renamed to hot2: name models/hot2" in said(refused)
    assert not Run.objects.filter(name__contains="again").exists()
    launched = researcher_client.post(reverse("run-launch"), posted(form))
    assert launched.status_code == 302 and Run.objects.filter(name="warm run (again)").exists()
    assert api(Client(), researcher, "post", reverse("api-runs"), launch_body("api", "models/hot2")).status_code == 201
