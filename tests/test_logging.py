"""Each log line is written once: a record of the dev server's request log reaches one handler."""
import logging


def handlers_reached(name: str) -> list[logging.Handler]:
    logger, found = logging.getLogger(name), []
    while logger is not None:
        found += [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]  # pytest's capture
        logger = logger.parent if logger.propagate else None
    return found


def test_a_request_line_and_an_engine_line_each_reach_one_handler():
    # django.channels.server: daphne's runserver (make demo); django.request: errors; the engine's own
    for name in ("django.channels.server", "django.request", "apps.runs.supervision", "workers.rft.loop"):
        assert len(handlers_reached(name)) == 1, (name, handlers_reached(name))
