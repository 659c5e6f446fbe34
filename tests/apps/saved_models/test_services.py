"""Saving a run's checkpoint as a model (apps/saved_models/services.py): what the directory holds,
that it outlives the checkpoint, that a run names it as its model.path, and that it is not deleted
while a run that may still load it names it. On a checkpoint shaped as the trainer writes one: the
built-in tiny model's files plus what only resuming reads."""
import errno
import os
import shutil

import pytest

from apps.runs.deletion import delete_runs
from apps.runs.models import Checkpoint, Run
from apps.runs.services import launch_run, validate_config
from apps.runs.supervision import run_dir
from apps.saved_models import services
from apps.saved_models.models import SavedModel
from apps.tasksets.services import load_builtin_tasksets
from workers.rft.models import resolve_model_path

pytestmark = pytest.mark.django_db
RESUME_FILES = {"optimizer.pt": b"adam", "rng.pt": b"rng", "trainer_state.json": b'{"step": 4}'}


@pytest.fixture
def checkpointed(make_run):
    """A completed run with checkpoint v2 (step 40) on disk, as Trainer.save_checkpoint lays it out."""
    run = make_run("warm-up", status=Run.Status.COMPLETED)
    directory = run_dir(run) / "checkpoints" / "step_40"
    shutil.copytree(resolve_model_path("tiny"), directory)
    for name, content in RESUME_FILES.items():
        (directory / name).write_bytes(content)
    (directory / "critic").mkdir()
    (directory / "critic" / "model.safetensors").write_bytes(b"critic")
    Checkpoint.objects.create(run=run, version=2, step=40, path=str(directory))
    yield run, directory
    shutil.rmtree(run_dir(run), ignore_errors=True)
    for saved in SavedModel.objects.all():
        shutil.rmtree(services.model_dir(saved), ignore_errors=True)


def leftovers() -> list[str]:
    root = services.models_root()
    return sorted(path.name for path in root.iterdir() if path.name.startswith(".")) if root.exists() else []


def test_a_saved_model_holds_the_weights_and_tokenizer_as_links_and_outlives_its_run(
        checkpointed, researcher, django_capture_on_commit_callbacks):
    run, checkpoint = checkpointed
    saved = services.save_model(run, 2, "sft-warm", researcher, note="SFT on the expert answers")
    target = services.model_dir(saved)
    assert target == services.models_root() / "sft-warm" and saved.model_path == "models/sft-warm"
    kept = {path.name for path in target.iterdir()}
    expected = {path.name for path in checkpoint.iterdir() if path.is_file()} - set(RESUME_FILES)
    assert kept == expected | {services.PROVENANCE} and "model.safetensors" in kept and "critic" not in kept
    weights = target / "model.safetensors"
    assert weights.stat().st_ino == (checkpoint / "model.safetensors").stat().st_ino  # a link, not a copy
    assert saved.size_bytes == sum((checkpoint / name).stat().st_size for name in expected)
    assert (saved.run, saved.run_name, saved.checkpoint_version, saved.step) == (run, "warm-up", 2, 40)
    assert '"step": 40' in (target / services.PROVENANCE).read_text()

    with django_capture_on_commit_callbacks(execute=True):
        delete_runs([run])  # the admin's Delete: its rows, then its directory
    assert not checkpoint.exists()
    saved.refresh_from_db()
    assert saved.run is None and saved.run_name == "warm-up" and weights.stat().st_size > 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(target) and AutoTokenizer.from_pretrained(target)


def test_where_links_fail_the_files_are_copied(checkpointed, researcher, monkeypatch):
    run, checkpoint = checkpointed

    def refuse(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    saved = services.save_model(run, 2, "copied", researcher)
    weights = services.model_dir(saved) / "model.safetensors"
    assert weights.read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    assert weights.stat().st_ino != (checkpoint / "model.safetensors").stat().st_ino


@pytest.mark.parametrize("name, problem", [
    ("", "a model's name is required"),
    ("warm\u200b", r"invisible character \(U\+200B\)"),
    ("warm\x07", r"control character \(U\+0007\)"),
    ("../escape", "1 to 100 letters"),
    ("a/b", "1 to 100 letters"),
    ("-leading", "1 to 100 letters"),
    ("x" * 101, "1 to 100 letters"),
    ("naïve", "1 to 100 letters"),
    ("tiny", "a built-in model's name"),
    ("smollm2-135m", "a built-in model's name"),
])
def test_a_bad_name_is_refused_and_nothing_is_left(checkpointed, researcher, name, problem):
    run, _ = checkpointed
    with pytest.raises(services.SaveError, match=problem):
        services.save_model(run, 2, name, researcher)
    assert not SavedModel.objects.exists() and leftovers() == []


def test_a_taken_name_a_directory_already_there_and_a_gone_checkpoint_are_refused(checkpointed, researcher):
    run, checkpoint = checkpointed
    services.save_model(run, 2, "first", researcher)
    with pytest.raises(services.SaveError, match="a saved model is already named 'first'"):
        services.save_model(run, 2, "first", researcher)
    (services.models_root() / "theirs").mkdir()
    try:
        with pytest.raises(services.SaveError, match="models/theirs already exists in the data directory"):
            services.save_model(run, 2, "theirs", researcher)
    finally:
        (services.models_root() / "theirs").rmdir()
    with pytest.raises(services.SaveError, match="has no checkpoint v7"):
        services.save_model(run, 7, "seven", researcher)
    shutil.rmtree(checkpoint)  # pruned by keep_checkpoints after the page listed it
    with pytest.raises(services.SaveError, match="checkpoint v2 of run warm-up: the checkpoint directory no longer"):
        services.save_model(run, 2, "gone", researcher)
    assert list(SavedModel.objects.values_list("name", flat=True)) == ["first"] and leftovers() == []


def test_a_checkpoint_deleted_while_it_is_linked_leaves_nothing(checkpointed, researcher, monkeypatch):
    run, checkpoint = checkpointed
    link = os.link

    def prune_midway(source, target):
        if str(source).endswith("tokenizer.json"):
            shutil.rmtree(checkpoint)  # keep_checkpoints, in the trainer's process, at this moment
        link(source, target)

    monkeypatch.setattr(os, "link", prune_midway)
    with pytest.raises(services.SaveError, match="was deleted while it was being saved"):
        services.save_model(run, 2, "racing", researcher)
    assert not SavedModel.objects.exists() and leftovers() == [] and not (services.models_root() / "racing").exists()


def test_a_run_trains_from_it_and_it_is_kept_while_a_run_that_may_load_it_names_it(checkpointed, researcher):
    load_builtin_tasksets()
    run, _ = checkpointed
    saved = services.save_model(run, 2, "sft-warm", researcher)
    config = {"model": {"path": "models/sft-warm"}, "algorithm": {"name": "grpo"},
              "buffer": {"taskset": "addition"}, "explorer": {"use_chat_template": False}}
    grpo = launch_run(researcher, "grpo from sft", config)
    assert grpo.config["model"]["path"] == str(services.model_dir(saved))  # stored resolved, as every model dir
    assert services.runs_naming([saved]) == {saved.pk: [grpo]}
    # As the KL's reference only, in a run of another model: it still loads it, and is listed as trained from it.
    models = {"path": "tiny", "ref_path": "models/sft-warm"}
    reference = launch_run(researcher, "kl to sft", {**config, "model": models})
    assert services.runs_naming([saved])[saved.pk] == [grpo, reference]
    assert services.runs_naming([saved]) == {saved.pk: [grpo, reference]}

    for status in (Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.STOPPED, Run.Status.FAILED):
        Run.objects.filter(pk=grpo.pk).update(status=status)
        Run.objects.filter(pk=reference.pk).update(status=Run.Status.COMPLETED)
        with pytest.raises(services.SaveError, match=rf"run grpo from sft \(#{grpo.pk}, {status}\) names "
                                                     "models/sft-warm and would load it"):
            services.delete_model(saved, researcher)
        assert SavedModel.objects.filter(pk=saved.pk).exists() and services.model_dir(saved).is_dir()
    Run.objects.filter(pk=grpo.pk).update(status=Run.Status.COMPLETED)
    services.delete_model(saved, researcher)
    assert not SavedModel.objects.exists() and not services.model_dir(saved).exists() and leftovers() == []
    # The completed runs keep their configs; launching one again names what is gone.
    with pytest.raises(Exception, match="no model directory at models/sft-warm"):
        validate_config(config)
