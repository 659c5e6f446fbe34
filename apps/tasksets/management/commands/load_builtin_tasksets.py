from django.core.management.base import BaseCommand

from apps.tasksets.services import load_builtin_tasksets


class Command(BaseCommand):
    help = ("Create the built-in generated tasksets that do not exist yet (addition, addition-eval, arithmetic, "
            "arithmetic-eval, countdown, episodes).")

    def handle(self, *args, **options):
        for name, created in load_builtin_tasksets():
            self.stdout.write(f"{name}: {'created' if created else 'exists, left as it is'}")
