"""What annotators of a run hear live: items taken, judged and released, and new experiences.

These messages are hints for the page (grey out a taken item, offer new work), not state: the
services check every judgement against the database, so a dropped message costs a refresh at
worst and needs none of the numbering the run dashboard uses.
"""
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def annotate_group(run_id: int) -> str:
    return f"annotate-{run_id}"


def broadcast(run_id: int | None, message: dict) -> None:
    """Send to the run's annotators once the current transaction commits."""
    if run_id is None:
        return  # imported expert data belongs to no run, and nobody watches it

    def send():
        # The judgement is committed: a channel layer that is slow or down must not turn it into
        # an error the annotator would retry. Pages catch up on their next request.
        try:
            async_to_sync(get_channel_layer().group_send)(
                annotate_group(run_id), {"type": "annotate.message", "payload": message}
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the layer: the hint is dropped
            logger.warning("annotation hint %s for run %s not sent: %r", message.get("type"), run_id, exc)

    transaction.on_commit(send)
