import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.runs import services
from apps.runs.models import Run
from workers.rft.config import ConfigError, parse_config_text
from workers.rft.json_values import text_problem


class Command(BaseCommand):
    help = "Launch a run from a YAML/JSON config (the same file `python -m workers.rft run` takes)."

    def add_arguments(self, parser):
        parser.add_argument("config", type=Path)
        parser.add_argument("--name", help="run name (default: the config file's name)")
        parser.add_argument("--owner", default="admin", help="username that owns the run")
        parser.add_argument("--wait", action="store_true", help="print progress until the run finishes")

    def handle(self, config: Path, name, owner, wait, **_):
        try:
            user = get_user_model().objects.get(username=owner)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {owner!r}; pass --owner or create one with create_admin") from None
        if not config.is_file():
            raise CommandError(f"{config}: no such file")
        name = name or config.stem
        if problem := text_problem(name):  # bytes that are not UTF-8 in argv arrive as lone surrogates
            raise CommandError(f"the run name {problem}")
        try:
            run = services.launch_run(user, name, parse_config_text(config.read_text()))
        except ConfigError as err:
            raise CommandError(f"{config}: invalid config\n{err}") from None
        self.stdout.write(f"launched run {run.pk} ({run.name})")
        if wait:
            follow(run, self.stdout.write)
            if run.status != Run.Status.COMPLETED:
                raise CommandError(f"run {run.pk} ended {run.status}: {run.error}")


def follow(run: Run, write, interval: float = 2.0) -> None:
    shown = None
    while True:
        run.refresh_from_db()
        line = describe(run)
        if line != shown:
            write(line)
            shown = line
        if run.is_finished:
            return
        time.sleep(interval)


def describe(run: Run) -> str:
    total = run.config.get("trainer", {}).get("total_steps", "?")
    latest = run.metrics.filter(role="explorer").order_by("-step").values_list("values", flat=True).first() or {}
    reward = f"  reward {latest['reward_mean']:.3f}" if "reward_mean" in latest else ""
    return (f"run {run.pk} {run.name!r}: {run.status}  trainer {run.trainer_step}/{total}  "
            f"explorer {run.explorer_step}  version {run.model_version}{reward}")
