"""Closing a user's open websockets when the user loses access.

A page checks its session on every request, but a socket is authorised once, at its handshake. So
every socket joins its user's group (`user_group`; apps.core.consumers.PingConsumer), and a change
that can take access away sends `access.check` there once it commits: a logout, a password change
(it ends the user's sessions), deactivation, deletion, a role (group) removed or staff status taken
away (apps.accounts.apps connects these). A logout ends one session: the sockets of the user's
other browsers check and stay open. A change of who may see one thing (a run's annotators) sends
it to that thing's group. Each socket that hears it checks again, as at its handshake, with its
session as it now is in the session store, and closes (4401, apps.core.consumers) if it may no
longer watch.
"""

import logging
from importlib import import_module

from asgiref.sync import async_to_sync
from channels.auth import get_user
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def recheck(group: str) -> None:
    """Have every socket in `group` check its access again, once the current transaction commits."""

    def send():
        try:
            async_to_sync(get_channel_layer().group_send)(group, {"type": "access.check"})
        except Exception as exc:  # noqa: BLE001 - the layer is down: its sockets cannot hear pushes either
            logger.error("access check of %s not sent; its open sockets keep their access (%r)", group, exc)

    transaction.on_commit(send)


async def session_user(session_key: str | None):
    """The user the session logs in now, or None: the session ended (a logout; a password change
    replaces the session it was made in) or no longer verifies (its user changed password since,
    was deactivated or deleted). The check a socket's handshake makes (channels' AuthMiddleware),
    on a fresh read of the session store."""
    if not session_key:
        return None
    user = await get_user({"session": import_module(settings.SESSION_ENGINE).SessionStore(session_key)})
    return user if user.is_authenticated else None


def user_saved(sender, instance, created, update_fields, **kwargs):
    # Every login saves last_login alone: nothing is taken away then.
    if not created and update_fields != frozenset({"last_login"}):
        recheck(user_group(instance.pk))


def user_deleted(sender, instance, **kwargs):
    recheck(user_group(instance.pk))


def user_logged_out(sender, request, user, **kwargs):
    """Django sends this before it flushes the session: the session goes from the store here, so
    the sockets that check find it gone (checking first, a socket found it still there and stayed
    open, streaming to a logged-out browser: a walkthrough saw it in 3 of 4 tries)."""
    if user is None:  # the request was not logged in
        return
    if request is not None and getattr(request, "session", None) is not None and request.session.session_key:
        request.session.delete()  # logout's flush, which follows, finds nothing left to delete
    recheck(user_group(user.pk))


def groups_changed(sender, instance, action, reverse, pk_set, **kwargs):
    """A role removed: `user.groups.remove/set/clear`, or from the group's side `group.user_set...`
    (whose clear names no users afterwards: they are read before)."""
    if action == "post_remove":
        user_ids = pk_set if reverse else {instance.pk}
    elif action == "pre_clear":
        user_ids = set(instance.user_set.values_list("pk", flat=True)) if reverse else {instance.pk}
    else:
        return
    for user_id in user_ids:
        recheck(user_group(user_id))
