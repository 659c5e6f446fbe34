import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.runs import capacity, services, supervision
from apps.runs.models import Run
from rftweb.celery import serve_here
from workers.rft.config import ConfigError, parse_config_text
from workers.rft.json_values import text_problem

from .demo import STOP_SECONDS


class Command(BaseCommand):
    help = (
        "Launch a run from a YAML/JSON config: the schema `python -m workers.rft run` takes, but each "
        "buffer taskset named as the server knows it (an uploaded or built-in taskset's name, not a "
        "generator spec or a file)."
    )

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
        with left_to_server():
            try:
                run = services.launch_run(user, name, parse_config_text(config.read_text()))
            except ConfigError as err:
                raise CommandError(f"{config}: invalid config\n{err}") from None
            self.stdout.write(f"launched run {run.pk} ({run.name})")
            see_through(run, wait, self.stdout.write)


# Embedded (no REDIS_URL) the demo server trains the runs these commands queue: it starts queued
# runs every RFTWEB_WATCHDOG_INTERVAL seconds (demo.pick_up), and a command's own threads would
# die with it (a run launched without --wait stayed queued for ever). A run still queued after an
# interval and this margin has no server to start it: `--wait` then trains it in the command.
SERVER_MARGIN_S = 10


@contextmanager
def left_to_server():
    """While a command queues a run and follows it: embedded, the run is the demo server's to start
    (serve_here), unless `follow` takes it on."""
    embedded = settings.RFTWEB_EMBEDDED
    if embedded:
        serve_here(False)
    try:
        yield
    finally:
        if embedded:
            serve_here(True)


def see_through(run: Run, wait: bool, write) -> None:
    """Once the command has queued the run: embedded, say who trains it; with --wait, follow it to
    its end (CommandError unless it completed)."""
    if not wait:
        if settings.RFTWEB_EMBEDDED:
            write(f"embedded (no REDIS_URL): the demo server (make demo) starts it within {pick_up_interval():.0f} s, "
                  "or when it next starts; --wait trains it in this command when no server does")
        return
    follow(run, write, serve_after=pick_up_interval() + SERVER_MARGIN_S if settings.RFTWEB_EMBEDDED else None)
    if run.status != Run.Status.COMPLETED:
        raise CommandError(f"run {run.pk} ended {run.status}: {run.error}")


def pick_up_interval() -> float:
    return settings.RFTWEB_WATCHDOG_INTERVAL


def follow(run: Run, write, interval: float = 2.0, serve_after: float | None = None) -> None:
    """Print the run's progress as it changes, until it ends. `serve_after` (embedded): seconds
    after which a run no server has started trains here, on this process's threads; Ctrl-C then
    saves it at a step boundary and hands it back, for the demo server to go on with."""
    shown, serving = None, False
    deadline = None if serve_after is None else time.monotonic() + serve_after
    try:
        while True:
            run.refresh_from_db()
            line = describe(run)
            if line != shown:
                write(line)
                shown = line
            if run.is_finished:
                break
            if deadline is not None and time.monotonic() > deadline and run.status == Run.Status.QUEUED:
                write(f"no demo server started run {run.pk} in {serve_after:.0f} s: it trains in this command "
                      "(Ctrl-C saves it and hands it back to the demo server)")
                serve_here(True)
                supervision.start_run(run.pk)  # a server that starts it first serves it: this does nothing
                deadline, serving = None, True
            time.sleep(interval)
    except KeyboardInterrupt:
        if serving:
            write(f"saving run {run.pk} at a step boundary (up to {STOP_SECONDS} s)...")
            capacity.stop_serving()
            supervision.wait_for_duties(STOP_SECONDS)
            raise CommandError(f"interrupted: run {run.pk} is handed back; the demo server (make demo) goes on "
                               "with it", returncode=130) from None
        raise
    if serving:  # its threads record the end (the duty let go, the last live messages) before the process exits
        supervision.wait_for_duties(STOP_SECONDS)


def describe(run: Run) -> str:
    total = run.config.get("trainer", {}).get("total_steps", "?")
    latest = run.metrics.filter(role="explorer").order_by("-step").values_list("values", flat=True).first() or {}
    reward = f"  reward {latest['reward_mean']:.3f}" if "reward_mean" in latest else ""
    return (f"run {run.pk} {run.name!r}: {run.status}  trainer {run.trainer_step}/{total}  "
            f"explorer {run.explorer_step}  version {run.model_version}{reward}")
