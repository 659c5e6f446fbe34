"""A saved model's names: renaming it, and its aliases (MLflow's "champion" and "challenger").

A run's config names a saved model by its directory, `model.path: models/<name>`, which a launch
stores resolved (<data dir>/models/<name>): by name, not by id. So a rename moves the directory,
and is refused while a run that would load it from there yet names it (services.still_loading: a
queued, unfinished, stopped or failed run), as a taskset's rename is (tasksets.services.
rename_problem). A finished run keeps the path it loaded: the old name stays the model's
(SavedModel.former_names), so that run is still among those trained from it, its bench scores
still its scores, and no other model may take that name."""

import json
import os
import re

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from . import services
from .models import ModelAlias, SavedModel
from .services import SaveError, may_change, model_dir

# Lower case only: "Champion" and "champion" would be two labels that read as one.
ALIAS = re.compile(rf"[a-z0-9][a-z0-9_-]{{0,{ModelAlias.MAX_NAME - 1}}}")


def check_may_change(user, saved: SavedModel, doing: str) -> None:
    if not may_change(user, saved):
        raise PermissionDenied(f"only {saved.created_by or 'its saver'}, who saved {saved.name}, or a curator may "
                               f"{doing} it")


def rename_model(saved: SavedModel, name: str, user) -> SavedModel:
    """Rename the model and its directory to `name`, for who saved it or a curator
    (PermissionDenied for anyone else); its own name changes nothing (a PATCH sent twice). SaveError
    names the problem and changes nothing: a bad or taken name, a run that would still load it
    from its directory, or a rename or deletion that came first (a conflict).

    It holds the model's row locked from its check of the runs to the move, as a launch that names
    the model does from its check of the directory to its run's creation (directories.lock_named):
    one waits for the other, so no run is left naming a directory moved from under it. Only runs
    naming its directory now are in the way: one naming a former name's could not load it anyway,
    and a rename back to that name is what mends it."""
    check_may_change(user, saved, "rename")
    name = (name or "").strip()
    if name == saved.name:
        return saved
    if problem := services.name_problem(name, instead_of=saved):
        raise SaveError(problem)
    old, before = saved.name, list(saved.former_names)
    try:
        with transaction.atomic():
            locked = SavedModel.objects.select_for_update().filter(pk=saved.pk).first()
            if locked is None:
                raise SaveError(f"{old} was deleted meanwhile", conflict=True)
            if locked.name != old:
                raise SaveError(f"{old} was renamed meanwhile to {locked.name}", conflict=True)
            if waiting := services.still_loading(locked, {str(model_dir(locked))}):
                raise SaveError(f"{waiting} (a run names a saved model by its directory). Rename it once they "
                                "have completed or been deleted.", key="runs")
            saved.former_names = [*(former for former in locked.former_names if former != name), old]
            saved.name = name
            saved.save(update_fields=["name", "former_names"])
            # Last, inside the transaction: a failure leaves the row and the directory as they were.
            os.rename(services.models_root() / old, services.models_root() / name)
    except IntegrityError:  # another rename or save took it (or it in another case) meanwhile
        saved.name, saved.former_names = old, before
        raise SaveError(services.taken_problem(name, instead_of=saved)
                        or f"a saved model is already named {name!r}") from None
    except OSError as err:
        saved.name, saved.former_names = old, before
        raise SaveError(f"could not move models/{old} to models/{name}: {err.strerror or err}") from None
    provenance = model_dir(saved) / services.PROVENANCE
    if provenance.exists():  # what a download says of it; the rest of it is as saved
        record = json.loads(provenance.read_text())
        provenance.write_text(json.dumps({**record, "name": name, "former_names": saved.former_names}, indent=1))
    return saved


def alias_problem(alias: str) -> str | None:
    if problem := services.text_problem(alias, "an alias"):
        return problem
    if not ALIAS.fullmatch(alias):
        return (f"an alias is 1 to {ModelAlias.MAX_NAME} lower-case letters, digits, '_' and '-', starting with a "
                f"letter or digit (champion, challenger): {alias!r} is not")
    return None


def set_alias(saved: SavedModel, alias: str, user) -> SavedModel | None:
    """Give the model the alias, for who saved it or a curator. An owner's alias labels one of
    their models: the model that carried it loses it. Returns that model (None if none did).
    SaveError names the problem (a bad alias, or the model carries it already)."""
    check_may_change(user, saved, "alias")
    alias = (alias or "").strip()
    if problem := alias_problem(alias):
        raise SaveError(problem, key="alias")
    try:
        with transaction.atomic():
            held = (ModelAlias.objects.select_for_update().select_related("model")
                    .filter(owner_id=saved.created_by_id, name=alias).first())
            if held is not None and held.model_id == saved.pk:
                raise SaveError(f"{saved.name} is {alias} already", key="alias")
            if held is None:
                ModelAlias.objects.create(name=alias, model=saved, owner_id=saved.created_by_id, set_by=user)
                return None
            moved_from = held.model
            held.model, held.set_by = saved, user
            held.save(update_fields=["model", "set_by", "set_at"])
            return moved_from
    except IntegrityError:  # set on another model at the same moment: the other came first
        raise SaveError(f"{alias} was set on another model at the same moment: reload and try again",
                        key="alias") from None


def remove_alias(saved: SavedModel, alias: str, user) -> bool:
    """Take the alias off the model, for who saved it or a curator: whether it carried it (a
    second click, or another tab, finds it gone)."""
    check_may_change(user, saved, "alias")
    deleted, _ = ModelAlias.objects.filter(model=saved, name=alias).delete()
    return bool(deleted)


def aliases_of(saved_models) -> dict[int, list[str]]:
    """{saved model id: its aliases, by name}, in one query."""
    found = {saved.pk: [] for saved in saved_models}
    for model_id, name in ModelAlias.objects.filter(model__in=list(found)).values_list("model_id", "name"):
        found[model_id].append(name)
    return found
