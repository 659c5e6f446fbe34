from django.core.management.base import BaseCommand, CommandError

from apps.runs import services
from apps.runs.models import Run


class Command(BaseCommand):
    help = "Ask runs to stop (their workers stop within one step)."

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="+", type=int)

    def handle(self, run_ids, **_):
        for run_id in run_ids:
            try:
                run = services.stop_run(Run.objects.get(pk=run_id))
            except Run.DoesNotExist:
                raise CommandError(f"no run with id {run_id}") from None
            except services.InvalidTransition as err:
                raise CommandError(str(err)) from None
            self.stdout.write(f"run {run_id}: {run.status}")
