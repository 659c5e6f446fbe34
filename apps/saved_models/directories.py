"""Where saved models live (<data dir>/models/<name>/) and which model a run's stored directory
names, now or before a rename. Only Django settings and the model here: apps/runs (a launch, a
resume, the launch form) asks these questions, and apps/runs is what services.py imports."""

from pathlib import Path

from django.conf import settings

from .models import SavedModel


def models_root() -> Path:
    return Path(settings.DATA_DIR).resolve() / "models"


def renamed_from(name: str) -> SavedModel | None:
    """The model named `name` before a rename (a link or bookmark from before it), or None: no two
    models share a former name (services.name_problem)."""
    return next((saved for saved in SavedModel.objects.all() if name in saved.former_names), None)


def saved_name(path: str) -> str | None:
    """The name of the model directory that `path` (absolute, as a launch stores it) is, if it is
    one under models_root: <data dir>/models/<name>."""
    path = Path(path)
    return path.name if path.is_absolute() and path.parent == models_root() else None


def _gone(path: str) -> tuple[str, SavedModel | None] | None:
    """(its name, the model renamed from it or None) where `path` is a saved-model directory that
    is not there; None where it is there, or is no saved model's."""
    name = saved_name(path)
    if name is None or (models_root() / name).is_dir():
        return None
    return name, renamed_from(name)


def missing(path: str) -> str | None:
    """Why a run cannot load the saved-model directory `path`, or None: it is there, or it is no
    saved model's. A model renamed since is named ("models/warm was renamed to hot")."""
    if (gone := _gone(path)) is None:
        return None
    name, renamed = gone
    if renamed is not None:
        return f"models/{name} was renamed to {renamed.name}: name models/{renamed.name}"
    return f"no model directory at models/{name}"


def strings(value):
    """Every string in a config (a run's, or part of it), at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def lock_named(paths: dict[str, str]) -> list[tuple[str, str]]:
    """Lock the saved models that `paths` ({config key: directory}) name, inside the caller's
    transaction (a rename takes the same lock, naming.rename_model), and say of each key whose
    directory is gone why (missing). A launch calls it right before it creates its run: a rename
    then waits for the run and sees it, or went first and the launch is refused, never a run left
    naming a directory moved away. (SQLite locks the whole database for a write instead.)"""
    names = sorted({name for path in paths.values() if (name := saved_name(path))})
    list(SavedModel.objects.select_for_update().filter(name__in=names).values_list("pk", flat=True))
    return [(key, problem) for key, path in paths.items() if (problem := missing(path))]


def moved_to(path: str) -> SavedModel | None:
    """The saved model whose former directory `path` is, now named otherwise, or None ("Launch
    again" of a run that loaded it before a rename: the form names it as it is now)."""
    gone = _gone(path)
    return gone and gone[1]


def not_resumable(config: dict) -> list[str]:
    """Why a stopped or failed run with this (stored) config cannot be resumed as it is: a saved
    model it loads renamed or deleted since it launched (it would fail again at start), each said
    once, with what mends it."""
    said = []
    for path in dict.fromkeys(strings(config)):
        if (gone := _gone(path)) is None:
            continue
        name, renamed = gone
        said.append(f"models/{name} was renamed to {renamed.name} since it launched: rename it back to {name} to "
                    f"resume this run, or Launch again (the form names it models/{renamed.name})" if renamed else
                    f"no model directory at models/{name} (deleted since it launched?)")
    return said
