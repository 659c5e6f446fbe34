"""What the API's routes read from a JSON body and a query string themselves, so that every problem (not
JSON, too big, an unknown field or query parameter, a NUL in a name, an invalid config) gets its own
message rather than pydantic's (or, for a query parameter, none: it was ignored)."""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig

from workers.rft.config import ConfigError, ConfigIssue, parse_config_text
from workers.rft.config_issues import unknown_hint
from workers.rft.config_text import MAX_REPORTED_ISSUES
from workers.rft.json_values import text_problem

from ..models import Run
from .auth import ApiError

MAX_NAME = Run._meta.get_field("name").max_length  # a sweep's too
SHOWN_FIELD = 100  # characters of an unknown field's name that a refusal repeats


def json_body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except RequestDataTooBig:
        raise ApiError(400, f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes") from None
    except (ValueError, RecursionError):  # ValueError: not JSON, not UTF-8, an int of 5,000 digits
        raise ApiError(400, "the body must be JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def known_fields(body: dict, fields) -> None:
    """Refuse every field the route does not take, each named with the closest one it does (as the
    config names an unknown key): a misspelt `configuration` was ignored, and the run launched on the
    default config."""
    refuse_unknown(body, fields, "field", " in the body")


def known_query(params, fields) -> None:
    """Refuse every query parameter the route does not read, as known_fields does a body's:
    `GET /api/runs/?stauts=stopped` answered every run, as if unfiltered."""
    refuse_unknown(params, fields, "query parameter")


def refuse_unknown(sent, known, what: str, where: str = "") -> None:
    unknown = [key[:SHOWN_FIELD] for key in sent if key not in known][:MAX_REPORTED_ISSUES]
    if not unknown:
        return
    listing = f"known {what}s"
    problems = [{"key": key, "message": f"unknown {what}" + unknown_hint(key, list(known), reported, listing)}
                for reported, key in enumerate(unknown)]
    plural = "s" if len(unknown) > 1 else ""
    raise ApiError(400, f"unknown {what}{plural}{where}: {', '.join(map(repr, unknown))}", errors=problems)


def name_of(body: dict, default: str) -> str:
    """`name`, at most MAX_NAME characters (the launch form's limit: a longer one was cut without a
    word); JSON can carry "\\u0000" or "\\ud800", which Postgres cannot store."""
    name = default if body.get("name") is None else body["name"]
    problem = "must be a string" if not isinstance(name, str) else text_problem(name)
    if not problem and not name.strip():
        problem = "is empty: leave it out for the default, or name the run"
    if not problem and len(name) > MAX_NAME:
        problem = f"is {len(name):,} characters long; at most {MAX_NAME}"
    if problem:
        raise ApiError(400, f"name {problem}", errors=[{"key": "name", "message": problem}])
    return name


def config_of(body: dict) -> dict:
    """`config`: a mapping, or YAML text (ConfigError when it is neither). Required, so that a body
    that lost it (or misspelt it) launches nothing: `{}` asks for the defaults."""
    config = body.get("config")
    if config is None:
        problem = "is required: the run config as an object ({} for the defaults) or as YAML text"
        raise ApiError(400, f"config {problem}", errors=[{"key": "config", "message": problem}])
    if isinstance(config, str) and not config.strip():
        raise ConfigError([ConfigIssue("<config>", "the YAML text is empty: send {} for the defaults")])
    if isinstance(config, str):
        config = parse_config_text(config)
    if not isinstance(config, dict):
        raise ConfigError([ConfigIssue("<config>", "expected a mapping or YAML text")])
    return config


def invalid(err, what: str = "invalid config") -> ApiError:
    """A 400 listing each issue of a ConfigError (or a SweepError) by its key."""
    return ApiError(400, what, errors=[{"key": issue.key, "message": issue.message} for issue in err.errors])
