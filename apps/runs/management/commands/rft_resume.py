from django.core.management.base import BaseCommand, CommandError

from apps.runs import services
from apps.runs.models import Run

from .rft_run import left_to_server, see_through


class Command(BaseCommand):
    help = (
        "Resume a paused, failed or stopped run: a failed or stopped one continues from its newest "
        "checkpoint (from step 0 if it has none) as the same run."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("--wait", action="store_true", help="print progress until the run finishes")

    def handle(self, run_id, wait, **_):
        try:
            run = Run.objects.get(pk=run_id)
        except Run.DoesNotExist:
            raise CommandError(f"no run with id {run_id}") from None
        was = run.status
        with left_to_server():
            try:
                services.resume_run(run)
            except services.InvalidTransition as err:
                raise CommandError(str(err)) from None
            self.stdout.write(services.describe_resume(run, was))
            see_through(run, wait, self.stdout.write)
