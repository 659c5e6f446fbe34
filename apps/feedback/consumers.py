"""The annotation channel of a run: who took or judged which item, and when new experiences arrive.

Annotators of the run (services.may_annotate: every annotator, or those assigned to it) may
listen; one taken off the run's annotators is closed (services.set_annotators). New experiences
are noticed on the run's own live group: every explorer step moves the run's `explorer_step`,
which this consumer passes on as `new_experiences`; a change of the run's status goes on as
`run_status`; nothing else of the dashboard's traffic.
"""
from apps.core.consumers import PingConsumer
from apps.runs.consumers import run_group

from .live import annotate_group


class AnnotateConsumer(PingConsumer):
    def live_groups(self):
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        return (annotate_group(self.run_id), run_group(self.run_id))

    def may_watch(self, user) -> bool:
        from apps.runs.models import Run

        from .services import may_annotate

        run = Run.objects.filter(pk=self.run_id).first()
        return run is not None and may_annotate(run, user)

    async def annotate_message(self, event):
        await self.send_json(event["payload"])

    async def run_update(self, event):
        updates = event["payload"].get("updates", [])
        steps = [u["explorer_step"] for u in updates if u.get("type") == "progress" and "explorer_step" in u]
        if steps:
            await self.send_json({"type": "new_experiences", "explorer_step": max(steps)})
        # A finished run writes nothing more, and what it trained on can no longer be judged.
        for update in updates:
            if update.get("type") == "status":
                await self.send_json({"type": "run_status", "status": update["status"]})
