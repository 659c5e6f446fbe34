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


def test_a_refused_page_logs_one_line_and_a_server_error_its_traceback(client, django_user_model, caplog):
    """A walkthrough's log held a traceback for every 403: the real errors drowned in them."""
    from django.urls import reverse

    from apps.accounts.roles import ANNOTATOR
    from apps.accounts.services import create_user

    client.force_login(create_user("ann", "pw-for-tests-123", roles=(ANNOTATOR,)))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get(reverse("run-list")).status_code == 403
    [refused] = [r for r in caplog.records if r.name == "django.request"]
    assert refused.getMessage() == "Forbidden (Permission denied): /runs/" and refused.exc_info is None

    from rftweb.errors import RefusalWithoutTraceback

    failed = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Internal Server Error: /", (),
                               (ValueError, ValueError("boom"), None))
    failed.status_code = 500
    assert RefusalWithoutTraceback().filter(failed) and failed.exc_info is not None
