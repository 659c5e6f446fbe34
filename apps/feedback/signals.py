"""A person who may no longer annotate lets go of the items they held, once the change commits:
deactivated (the People page or the admin), or a role taken away (either side of the groups).
A change of a run's annotators does it in services.set_annotators / assign_annotator."""
from django.db import transaction


def _release_after_commit(user_ids) -> None:
    from .services import release_lost_locks

    user_ids = set(user_ids)
    if user_ids:
        transaction.on_commit(lambda: release_lost_locks(user_ids=user_ids))


def user_saved(sender, instance, created, update_fields, **kwargs):
    if not created and not instance.is_active:
        _release_after_commit({instance.pk})


def groups_changed(sender, instance, action, reverse, pk_set, **kwargs):
    # As apps.accounts.revocation.groups_changed: a clear from the group's side names no users
    # afterwards, so they are read before.
    if action == "post_remove":
        _release_after_commit(pk_set if reverse else {instance.pk})
    elif action == "pre_clear":
        _release_after_commit(instance.user_set.values_list("pk", flat=True) if reverse else {instance.pk})
