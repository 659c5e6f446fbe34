"""A researcher's saved views of the runs list (W&B's saved views): the columns, grouping, sort and
filters of the list as they see it, under a name, to open again with a click (RunListView). Kept
as the list's own query, its valid parts only (what the CSV link carries: run_table.csv_query), so
a view opens as the address it was saved from did, and a link to it shares it.

A name saved twice is refused, not replaced: the view under it may be a week's careful pick, and a
save is one click; the refusal names the view and says how to replace it (delete it, save again)."""

import unicodedata

from django.db import IntegrityError, transaction
from django.http import QueryDict

from . import run_table
from .forms import RunFilterForm
from .models import RunListView

MAX_VIEWS = 50  # a researcher's; past it a save is refused (delete one)


class BadView(ValueError):
    pass


def views_of(user) -> list[RunListView]:
    return list(RunListView.objects.filter(user=user))


JOINERS = "\u200c\u200d"  # zero-width non-joiner and joiner


def clean_name(name: str) -> str:
    """The name as saved (spaces around it dropped); BadView says what is wrong with it."""
    name = name.strip()
    if not name:
        raise BadView("Name the view to save it")
    if len(name) > RunListView.MAX_NAME:
        raise BadView(f"A view's name of {len(name):,} characters: at most {RunListView.MAX_NAME}")
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in name):
        raise BadView("A view's name holds a control character: write it as text")
    # Invisible ones too: "lr groups" and "lr groups" + U+200B were two views that read the same.
    # Joiners stay: scripts and emoji are written with them.
    hidden = next((char for char in name if unicodedata.category(char) == "Cf" and char not in JOINERS), None)
    if hidden is not None:
        raise BadView(f"A view's name holds an invisible character (U+{ord(hidden):04X}): write it as text")
    return name


def save_view(user, name: str, query: str) -> RunListView:
    """Keep `query` (the list's, its valid parts) as `user`'s view `name`; BadView if the name is
    bad or taken, or the user has MAX_VIEWS already."""
    name = clean_name(name)
    if RunListView.objects.filter(user=user, name=name).exists():
        raise BadView(f"You have a view named {name!r} already: delete it first to save this one under its name, "
                      "or pick another name")
    if RunListView.objects.filter(user=user).count() >= MAX_VIEWS:
        raise BadView(f"You have {MAX_VIEWS} saved views, the most one keeps: delete one first")
    try:
        with transaction.atomic():
            return RunListView.objects.create(user=user, name=name, query=query)
    except IntegrityError:  # the same name saved at the same moment from another tab
        raise BadView(f"You have a view named {name!r} already") from None


def save_from_list(user, name: str, query) -> tuple[RunListView, QueryDict, list[str]]:
    """Save the list of `query` (its address) as `user`'s view `name`: (the view, the query kept,
    what of it was not applied and is left out, a line each)."""
    filters = RunFilterForm(query)
    view = run_table.table_view(query, run_table.saved_columns(user))
    kept = QueryDict(run_table.csv_query(query, filters, view), mutable=True)  # a bad filter left out
    saved = save_view(user, name, kept.urlencode(safe=",/:"))
    return saved, kept, [f"{field}: {' '.join(errors)}" for field, errors in filters.errors.items()] + view.errors


def delete_view(user, view_id) -> str:
    """Delete `user`'s view of that id; its name. Another's view, or none, is BadView."""
    view = RunListView.objects.filter(user=user, pk=view_id).first() if str(view_id).isdigit() else None
    if view is None:
        raise BadView("No such view of yours: it was deleted already, or it is someone else's")
    view.delete()
    return view.name


def current(views: list[RunListView], query) -> RunListView | None:
    """The saved view the list shows now: the one whose query the address holds (any order)."""
    shown = _canonical(query)
    return next((view for view in views if _canonical(QueryDict(view.query)) == shown), None)


def _canonical(query) -> list:
    return sorted((name, tuple(query.getlist(name))) for name in query if name not in ("page", "expand"))
