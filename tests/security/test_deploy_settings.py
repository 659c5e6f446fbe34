"""Production settings (DEBUG off): `check --deploy` clean, HTTPS-only cookies and headers,
secrets only from the environment. Each check starts Django afresh in a subprocess with the
production environment, as a deployment would."""
import json
import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

MANAGE = [sys.executable, str(settings.BASE_DIR / "manage.py")]


def prod_env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("DEBUG", "SECRET_KEY")}
    env.update({"DJANGO_SETTINGS_MODULE": "rftweb.settings", "SECRET_KEY": secrets.token_urlsafe(50), **extra})
    return env


def manage(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([*MANAGE, *args], env=env, capture_output=True, text=True, timeout=120, cwd=settings.BASE_DIR)


def test_check_deploy_is_clean_with_the_production_environment():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=prod_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_without_a_secret_key_production_refuses_to_start():
    env = prod_env()
    del env["SECRET_KEY"]
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set in the environment" in result.stderr


def test_the_secret_key_comes_from_the_environment():
    key = secrets.token_urlsafe(50)
    result = manage(
        "shell", "-c", "from django.conf import settings; print(settings.SECRET_KEY)", env=prod_env(SECRET_KEY=key)
    )
    assert result.stdout.strip().splitlines()[-1] == key
    # No key, password or token is written in the settings themselves.
    source = (settings.BASE_DIR / "rftweb" / "settings.py").read_text()
    assert "insecure-dev-key\" if DEBUG" in source  # the one literal key, for DEBUG only


PROBE = """
import json
from django.test import Client
response = Client().get("/accounts/login/", secure=True)
response_http = Client().get("/accounts/login/")
print(json.dumps({
    "status": response.status_code,
    "headers": dict(response.headers),
    "cookies": {
        name: {"secure": bool(c["secure"]), "httponly": bool(c["httponly"]), "samesite": c["samesite"]}
        for name, c in response.cookies.items()
    },
    "http_status": response_http.status_code,
    "http_location": response_http.headers.get("Location", ""),
}))
"""


def test_production_responses_carry_the_secure_headers_and_cookies():
    result = manage("shell", "-c", PROBE, env=prod_env(ALLOWED_HOSTS="testserver"))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["status"] == 200
    headers = seen["headers"]
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"
    # Scripts from this site only: an injected <script> or onerror= does not run (tests/e2e/test_csp.py).
    policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["object-src"] == "'none'", policy
    assert seen["cookies"]["csrftoken"]["secure"] and seen["cookies"]["csrftoken"]["samesite"] == "Lax"
    # Plain HTTP is sent to HTTPS.
    assert seen["http_status"] == 301 and seen["http_location"].startswith("https://")
