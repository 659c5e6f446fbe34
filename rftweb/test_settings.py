"""Test settings: real Postgres and Redis (the test command starts them), never the embedded default."""
import os

# `make test` runs pytest-xdist workers side by side (PYTEST_XDIST_WORKER gw0, gw1...; unset
# without xdist): each has a Redis database and a data dir of its own; pytest-django already gives
# each its own test database (test_rftweb_gw0...). Without xdist: Redis /14 and data/test, as ever.
# The processes a worker's tests start inherit its variable and the values set here.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_worker = int(XDIST_WORKER.removeprefix("gw") or 0)
# Per worker: (the tests' own Redis database, the newcomer journey's demo's), on the server
# RFTWEB_TEST_REDIS names (another one lets two test sessions share a machine; a REDIS_URL set
# by hand would be every worker's, and each flushes it). /0 is a deployment's default; bench/
# uses /9 to /12.
_REDIS_DBS = [(14, 12), (13, 15), (8, 7), (6, 5), (4, 3), (2, 1)]
if _worker >= len(_REDIS_DBS):
    raise RuntimeError(f"the tests have Redis databases for {len(_REDIS_DBS)} xdist workers, not {_worker + 1}")
_redis_db, _demo_redis_db = _REDIS_DBS[_worker]
_redis = os.environ.get("RFTWEB_TEST_REDIS", "redis://localhost:6379").rstrip("/")

# What this file puts in the environment for this process's worker alone: the xdist controller
# imports these settings too, and tests/conftest.py takes these out of its environment before it
# starts the workers (they would inherit them, and keep them: setdefault).
TEST_WORKER_ENV = [name for name in ("REDIS_URL", "RFTWEB_DATA_DIR") if name not in os.environ]

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@localhost:5432/rftweb")
os.environ.setdefault("REDIS_URL", f"{_redis}/{_redis_db}")
_data_dir = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "test")
os.environ.setdefault("RFTWEB_DATA_DIR", os.path.join(_data_dir, XDIST_WORKER) if XDIST_WORKER else _data_dir)
# Tests kill workers on purpose: notice a dead one in seconds, not minutes.
os.environ.setdefault("RFTWEB_HEARTBEAT_INTERVAL", "1")
os.environ.setdefault("RFTWEB_HEARTBEAT_TIMEOUT", "6")
# Tests open event loops and threads by the hundred; a connection kept by each would pile up to
# Postgres's max_connections (the load test's server sets the production default itself).
os.environ.setdefault("DB_CONN_MAX_AGE", "0")

from .settings import *  # noqa: E402,F401,F403

# The newcomer journey's `manage.py demo` (full stack) brokers on a Redis database of its own.
TEST_DEMO_REDIS_URL = f"{_redis}/{_demo_redis_db}"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
