from django.core.management.base import BaseCommand, CommandError

from apps.runs.models import Run

from .rft_run import describe, follow


class Command(BaseCommand):
    help = "Show runs (all unfinished ones, or the given ones); --follow prints progress until they end."

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="*", type=int)
        parser.add_argument("--follow", action="store_true")

    def handle(self, run_ids, **options):
        runs = Run.objects.filter(pk__in=run_ids) if run_ids else Run.objects.exclude(status__in=Run.FINISHED)
        missing = set(run_ids) - set(runs.values_list("pk", flat=True))
        if missing:
            raise CommandError(f"no run with id {', '.join(map(str, sorted(missing)))}")
        if options["follow"] and len(runs) == 1:
            follow(runs[0], self.stdout.write)
            return
        for run in runs:
            self.stdout.write(describe(run))
        if not runs:
            self.stdout.write("no unfinished runs")
