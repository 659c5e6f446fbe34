"""Saved models: a run's checkpoint kept as a model of its own (models.SavedModel).

A checkpoint is already a Hugging Face directory a run may name as its model.path, but it belongs
to its run: keep_checkpoints deletes it once newer ones are saved, and deleting the run deletes it.
Saving one puts its weights and tokenizer under <data dir>/models/<name>/, which only deleting the
saved model removes, and which the launch form offers as `models/<name>`.

The files are hard links where the data dir allows them (a checkpoint file is written once, into a
directory of its own, and never changed in place: the trainer writes a new directory and renames
it), so saving a 1.7B model's 6.8 GB of fp32 weights takes no space and milliseconds; a copy where
links fail (another filesystem). Optimizer state, RNG and step (what only resuming reads; the
optimizer is about twice the weights) and the critic stay behind."""

import json
import os
import re
import shutil
import unicodedata
import uuid
from pathlib import Path

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.http import Http404
from django.utils import timezone
from django.utils.text import slugify

from apps.accounts.roles import CURATOR, has_role
from apps.core.bidi import isolate
from apps.runs.checkpoints import run_checkpoint_dir
from apps.runs.models import Checkpoint, Run
from apps.runs.presets import PRESETS, on_taskset, preset_config
from apps.runs.supervision import run_dir
from apps.tasksets.models import Taskset

from .directories import models_root, strings
from .models import MAX_NOTE, SavedModel

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# What only resuming reads (Trainer.save_checkpoint): a saved model is weights and tokenizer.
RESUME_ONLY = {"optimizer.pt", "critic_optimizer.pt", "rng.pt", "trainer_state.json"}
PROVENANCE = "saved_from.json"  # in the directory, so a download says where it came from


class SaveError(Exception):
    """A model that cannot be saved, renamed, aliased or deleted as asked; the message says why, to
    its user, and `key` which of what they sent it is about (a form's field, an API body's key), or
    "runs" where runs that would still load it are in the way (the API's 409)."""

    def __init__(self, message: str, key: str = "name", conflict: bool = False):
        super().__init__(message)
        self.key = key
        # The API's 409: runs in the way, or another's change that came first (a rename, a deletion).
        self.conflict = conflict or key == "runs"


def model_dir(saved: SavedModel) -> Path:
    return models_root() / saved.name


def default_name(run: Run, version: int) -> str:
    return f"{slugify(run.name)[:80] or 'run'}-{run.pk}-v{version}"


def model_dirs(saved: SavedModel) -> set[str]:
    """Every directory a run may name it by: its own, and those of its former names (a finished
    run keeps the path it loaded; rename_model)."""
    return {str(models_root() / name) for name in (saved.name, *saved.former_names)}


JOINERS = "\u200c\u200d"  # zero-width non-joiner and joiner: as apps/runs/saved_views.py lets them be


def text_problem(name: str, what: str) -> str | None:
    """Why `name` cannot be `what` (a model's name, an alias) for a character it holds, or None:
    an empty one, a control character, an invisible one ("warm" and "warm" + U+200B would read
    the same; apps/runs/saved_views.py refuses them in a view's name for that)."""
    if not name:
        return f"{what} is required: it was empty"
    control = next((char for char in name if unicodedata.category(char) in ("Cc", "Cs")), None)
    if control is not None:
        return f"{what} holds a control character (U+{ord(control):04X}): write it as text"
    hidden = next((char for char in name if unicodedata.category(char) == "Cf" and char not in JOINERS), None)
    if hidden is not None:
        return f"{what} holds an invisible character (U+{ord(hidden):04X}): write it as text"
    return None


def name_problem(name: str, instead_of: SavedModel | None = None) -> str | None:
    """Why `name` cannot name a new saved model (or `instead_of`, renamed), or None. Taken is
    case-insensitive: "Warm" beside "warm" reads as one model in a list, and would be one
    directory on a case-insensitive filesystem. A former name of another model is taken too: runs
    that loaded that model name its directory so."""
    from workers.rft.models import BUILTIN_MODELS

    if problem := text_problem(name, "a model's name"):
        return problem
    if not NAME.fullmatch(name):
        return ("a model's name is 1 to 100 letters, digits, '.', '_' and '-', starting with a letter or digit: "
                f"{name!r} is not")
    builtin = next((builtin for builtin in BUILTIN_MODELS if builtin.lower() == name.lower()), None)
    if builtin is not None:  # models/TINY would be models/tiny on a case-insensitive filesystem
        case = "" if builtin == name else " (names that differ in case only are one name)"
        return f"{builtin!r} is a built-in model's name{case}"
    if problem := taken_problem(name, instead_of):
        return problem
    own = instead_of is not None and name.lower() == instead_of.name.lower()  # a change of case: its own directory
    if (models_root() / name).exists() and not own:
        return f"models/{name} already exists in the data directory (a model someone put there)"
    return None


def taken_problem(name: str, instead_of: SavedModel | None = None) -> str | None:
    """Why another saved model's name or former name takes `name` (case-insensitively), or None.
    name_problem's check, and what a save or rename that lost a race to another says: the database's
    constraint on Lower(name) (models.SavedModel) refuses it then, as this check would have."""
    others = SavedModel.objects.exclude(pk=instead_of.pk) if instead_of is not None else SavedModel.objects.all()
    for other, former in others.values_list("name", "former_names"):  # a few hundred at most: no index to use
        if other.lower() == name.lower():
            case = "" if other == name else " (names that differ in case only are one name)"
            return f"a saved model is already named {other!r}{case}"
        if name.lower() in (old.lower() for old in former):
            return (f"{name!r} was saved model {other!r}'s name until it was renamed: runs that loaded it name it "
                    "so, so no other model may take it")
    return None


def save_model(run: Run, version: int, name: str, user, note: str = "") -> SavedModel:
    """Save checkpoint v`version` of `run` as the model `name`. Raises SaveError naming the problem
    (a taken or bad name, a checkpoint that is gone); nothing is left behind then."""
    name = (name or "").strip()
    if problem := name_problem(name):
        raise SaveError(problem)
    if len(note) > MAX_NOTE:  # the form's and the API's one check: a longer note was cut to fit, unsaid
        raise SaveError(f"a note is at most {MAX_NOTE} characters: this one has {len(note)}", key="note")
    checkpoint = Checkpoint.objects.filter(run=run, version=version).first()
    if checkpoint is None:
        raise SaveError(f"run {run.name} has no checkpoint v{version}")
    try:
        source = run_checkpoint_dir(checkpoint, run_dir(run))
    except (PermissionDenied, Http404) as err:  # outside the run's checkpoints, or gone from the disk
        raise SaveError(f"checkpoint v{version} of run {run.name}: {err}") from None
    target = models_root() / name
    tmp = models_root() / f".{name}.{uuid.uuid4().hex}"
    try:
        with transaction.atomic():
            saved = SavedModel.objects.create(
                name=name, run=run, run_name=run.name, checkpoint_version=version, step=checkpoint.step,
                note=note, created_by=user,
            )
            saved.size_bytes = _link_or_copy(source, tmp)
            (tmp / PROVENANCE).write_text(json.dumps({
                "name": name, "run": run.pk, "run_name": run.name, "checkpoint_version": version,
                "step": checkpoint.step, "saved_by": getattr(user, "username", None),
                "saved_at": timezone.now().isoformat(), "note": saved.note,
            }, indent=1))
            saved.save(update_fields=["size_bytes"])
            os.rename(tmp, target)  # on one filesystem: atomic, and refused if another save got there first
    except IntegrityError:  # two saves of one name (or of names differing in case) at once: the other's came first
        raise SaveError(taken_problem(name) or f"a saved model is already named {name!r}") from None
    except FileNotFoundError:  # keep_checkpoints deleted it meanwhile
        raise SaveError(f"checkpoint v{version} of run {run.name} was deleted while it was being saved "
                        "(its run keeps only its newest trainer.keep_checkpoints): save a newer one") from None
    except OSError as err:
        if target.exists() and not SavedModel.objects.filter(name=name).exists():
            raise SaveError(f"models/{name} already exists in the data directory") from None
        raise SaveError(f"could not save models/{name}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return saved


def _link_or_copy(source: Path, target: Path) -> int:
    """The checkpoint's top-level files but RESUME_ONLY into target (made here): hard links, or
    copies where the filesystem refuses them. Returns their bytes."""
    target.mkdir(parents=True)
    size = 0
    for path in sorted(source.iterdir()):
        if path.name in RESUME_ONLY or path.is_symlink() or not path.is_file():
            continue  # critic/, adapter/ (the weights are the merged ones), and no link to elsewhere
        try:
            os.link(path, target / path.name)
        except OSError:
            shutil.copy2(path, target / path.name)
        size += path.stat().st_size
    return size


def runs_naming(saved_models, statuses=None) -> dict[int, list[Run]]:
    """{saved model id: the runs whose config names its directory, as any model a run loads
    (model.path, ref_path, critic_path, a reward fn's model), in id order}, in one query: a launch stores
    each model a run loads resolved, absolute (apps.runs.services.validate_config). Narrowed in the
    database by the names (ASCII, so the same text in either database's JSON), then checked value
    by value. The Models page's "Trained from it" and the deletion's refusal ask this one question."""
    by_dir = {directory: saved.pk for saved in saved_models for directory in model_dirs(saved)}
    found = {pk: [] for pk in by_dir.values()}
    if not found:
        return found
    mentions = Q()
    for saved in saved_models:
        for name in (saved.name, *saved.former_names):
            mentions |= Q(text__contains=f"/models/{name}")
    runs = Run.objects.annotate(text=Cast("config", TextField())).filter(mentions)
    if statuses is not None:
        runs = runs.filter(status__in=statuses)
    for run in runs.only("pk", "name", "status", "config", "created_at", "started_at").order_by("pk"):
        named = set(strings(run.config))
        for directory in named & by_dir.keys():
            found[by_dir[directory]].append(run)
    return found


def model_uses(run: Run, saved: SavedModel) -> list[str]:
    """How `run` (one of runs_naming's) loads the model, in words: the policy it trains (model.path;
    "evaluated" for a mode-bench run, which trains nothing), its reference (ref_path), its critic
    (critic_path), a reward fn's model."""
    directories, model = model_dirs(saved), run.config.get("model") or {}
    uses = []
    if model.get("path") in directories:
        uses.append("evaluated" if run.config.get("mode") == Run.Mode.BENCH else "policy")
    uses += [use for key, use in (("ref_path", "reference"), ("critic_path", "critic"))
             if model.get(key) in directories]
    rest = {key: value for key, value in run.config.items() if key != "model"}
    if directories & set(strings(rest)):
        uses.append("reward model")
    return uses


# A run that may still load its models: it has not started, is training, or can be resumed.
STILL_LOADS = (Run.Status.QUEUED, *Run.ACTIVE, Run.Status.STOPPED, Run.Status.FAILED)


def still_loading(saved: SavedModel, directories: set[str] | None = None) -> str | None:
    """The runs that would load the model from one of its directories yet (STILL_LOADS), each with
    the directory it names, in words, or None: neither a deletion nor a rename may take that
    directory from under them. `directories`: only these of its own (model_dirs, by default)."""
    directories = model_dirs(saved) if directories is None else directories
    waiting = [(run, sorted(set(strings(run.config)) & directories))
               for run in runs_naming([saved], STILL_LOADS)[saved.pk]]
    waiting = [(run, named) for run, named in waiting if named]
    if not waiting:
        return None
    runs = ", ".join(f"run {run.name} (#{run.pk}, {run.status}) names {', '.join(map(shown, named))}"
                     for run, named in waiting)
    return (f"{runs} and would load it when "
            f"{'it starts or is resumed' if len(waiting) == 1 else 'they start or are resumed'}")


def shown(directory: str) -> str:
    """A model directory as a run's config names it on the form: models/<name>."""
    return f"models/{Path(directory).name}"


def may_change(user, saved: SavedModel) -> bool:
    """Who may delete, rename or alias it: who saved it, or a curator."""
    return saved.created_by_id == user.pk or has_role(user, CURATOR)


def delete_model(saved: SavedModel, user) -> None:
    """Delete the saved model and its directory, for who saved it or a curator (PermissionDenied
    for anyone else). Refused (SaveError, nothing deleted) while a run that may still load it names
    it: a queued or unfinished run starts from it, and a stopped or failed one loads it again when
    resumed (its reference model for the KL, at least)."""
    if not may_change(user, saved):
        raise PermissionDenied(f"only {saved.created_by or 'its saver'}, who saved {saved.name}, or a curator may "
                               "delete it")
    if waiting := still_loading(saved):
        raise SaveError(f"Not deleted: {waiting}. Delete it once they have completed or been deleted.")
    directory = model_dir(saved)
    with transaction.atomic():
        saved.delete()
        # Renamed away first, inside the transaction: a failure leaves the row and the files both.
        doomed = directory.with_name(f".deleted-{saved.name}.{uuid.uuid4().hex}")
        if directory.exists():
            os.rename(directory, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


# The preset "Train from it" opens when the source run's config cannot serve: the second stage
# the Models page advertises (an SFT warm-up, then GRPO from it).
CONTINUE_PRESET = "smollm2-grpo"


def train_from(saved: SavedModel, taskset=None) -> tuple[dict, str | None, str]:
    """(config, preset or None, what the launch form says of it) for "Train from it": the config
    of the run the model was saved from, training from the model, as W&B and MLflow launch from an
    artifact. Its reference and critic follow the model when they were the source's model (empty:
    model.path). An SFT warm-up continues with GRPO (CONTINUE_PRESET) on its taskset and with its
    prompt format: the source's SFT settings (lr 1e-5, no rollouts) would repeat the warm-up. A
    source run that is deleted leaves CONTINUE_PRESET, said. `taskset` (?taskset=) goes in last."""
    source = saved.run
    if source is None:
        config, preset = preset_config(CONTINUE_PRESET), CONTINUE_PRESET
        model = {**config["model"], "path": saved.model_path}
        said = (f"{saved.name} was saved from run {isolate(saved.run_name)}, which is deleted: the form opens the "
                f"{PRESETS[preset].title} preset on it, not that run's settings. Check them before launching.")
    else:
        model = {**source.config["model"], "path": saved.model_path}
        for key in ("ref_path", "critic_path"):
            if model.get(key) == source.config["model"]["path"]:
                model[key] = None
        if source.config["algorithm"]["name"] == "sft":
            config, preset = preset_config(CONTINUE_PRESET), CONTINUE_PRESET
            prompt = {key: source.config["explorer"][key] for key in ("use_chat_template", "system_prompt")}
            config = {**config, "explorer": {**config["explorer"], **prompt}}
            warmed_on = Taskset.objects.filter(name=source.config["buffer"]["taskset"]).first()
            if warmed_on:
                config = on_taskset(config, warmed_on)
            said = (f"{saved.name} is an SFT warm-up (run {isolate(source.name)}): the form opens GRPO from it"
                    f"{f' on {isolate(warmed_on.name)}' if warmed_on else ''}, its prompt format kept. The SFT preset "
                    "continues the SFT instead.")
        else:
            config, preset = source.config, None
            said = f"The settings of run {isolate(source.name)}, which {saved.name} was saved from, training from it."
    config = {**config, "model": model}
    if taskset:
        config = on_taskset(config, taskset)
    return config, preset, said
