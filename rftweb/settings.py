"""Settings, read from the environment.

With no DATABASE_URL / REDIS_URL the project runs embedded: SQLite in the data dir, an in-memory
channel layer and Celery tasks executed in-process. Production and the tests set both.
"""
import math
import os
import socket
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in {"1", "true", "yes", "on"}


def env_number(name: str, default: float, *, positive: bool = False) -> float:
    """A number of at least 0 (more than 0 with `positive`). A bad value stops the process as it
    starts, naming the variable: a typo must not quietly turn a deleting job off, or on."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise RuntimeError(f"{name} must be a number {'above' if positive else 'of at least'} 0, not {raw!r}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise RuntimeError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or ("insecure-dev-key" if DEBUG else None)
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set in the environment when DEBUG is off")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# Models, checkpoints and uploads live here. The engine reads the same variable.
DATA_DIR = Path(os.environ.get("RFTWEB_DATA_DIR", BASE_DIR / "data")).resolve()
os.environ.setdefault("RFTWEB_DATA_DIR", str(DATA_DIR))
# Model directories a run may load, besides the data dir (comma-separated; checked at launch).
RFTWEB_MODEL_DIRS = [d for d in os.environ.get("RFTWEB_MODEL_DIRS", "").split(",") if d]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # its Swagger UI template and static files, for /api/docs/ (no CDN)
    "apps.core",
    "apps.accounts",
    "apps.tasksets",
    "apps.runs",
    "apps.buffer",
    "apps.feedback",
    "apps.alerts",
    "apps.saved_models",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "rftweb.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "rftweb.errors.RejectNulMiddleware",  # before anything reads a parameter (CSRF reads the form)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "rftweb.errors.CommonMiddleware",  # Django's, with a 308 for an API address without its slash
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "rftweb.urls"
ASGI_APPLICATION = "rftweb.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "builtins": ["apps.core.templatetags.text"],  # names (|bdi) and messages (|ticks) on every page
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.accounts.context_processors.roles",
            ]
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'rftweb.sqlite3'}"
# Connections are kept for a minute (workers, the websocket consumers' shared thread); the ASGI
# server closes each HTTP request's own when the request ends (rftweb/asgi.py).
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", 60)))}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    # The embedded worker thread writes while pages read: wait for the lock rather than fail.
    # WAL lets pages read while the worker writes.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30, "init_command": "PRAGMA journal_mode=WAL", "transaction_mode": "IMMEDIATE",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s timeout by default, which breaks the layer's blocking
            # receive and drops every quiet websocket (django/channels_redis#422).
            # max_connections: redis-py's pool refuses (MaxConnectionsError) past 100 by default, and
            # every socket's handshake joins two groups (its run's and its user's, for revocation):
            # 100 pages opening at once got 500s.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None, "max_connections": 2000}],
                       "capacity": 1000, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Django's cache holds the login throttle's counts (apps.accounts.throttle): in Redis, shared by
# every web process; embedded, in this process's memory.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery. One long task per worker process (prefetch 1, acks_late) so a killed worker's run step
# is redelivered; the visibility timeout must outlast the longest step or Redis redelivers it
# while it is still running.
# Embedded (no REDIS_URL): no broker; tasks run on threads of the web process (rftweb.celery.enqueue).
RFTWEB_EMBEDDED = not REDIS_URL
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = REDIS_URL or "cache+memory://"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", 6 * 3600))}
CELERY_TASK_DEFAULT_QUEUE = "default"
# Everything else, jobs included (apps.core.tasks.run_job), goes to "default".
CELERY_TASK_ROUTES = {"workers.tasks.serve_duty": {"queue": "train"}}  # the explorer duty is sent to "explore"
# Buffer retention (apps/buffer/retention.py): every RETENTION_INTERVAL seconds (a day), one job
# archives (or drops) the experiences of the runs that ended more than RETENTION_DAYS days ago,
# keeping human edits and rows with feedback. 0 days, the default, is off: it deletes rows, so a
# server never starts doing it unasked. Archive by default: a Parquet file of what went, which the
# job's page downloads; drop keeps no copy.
RFTWEB_BUFFER_RETENTION_DAYS = env_number("RFTWEB_BUFFER_RETENTION_DAYS", 0)
RFTWEB_BUFFER_RETENTION_ACTION = env_choice("RFTWEB_BUFFER_RETENTION_ACTION", "archive", ("archive", "drop"))
RFTWEB_BUFFER_RETENTION_INTERVAL = env_number("RFTWEB_BUFFER_RETENTION_INTERVAL", 24 * 3600, positive=True)
# The buffer's full-text search documents are made after the write (apps/buffer/search.py): every
# INTERVAL seconds a worker makes those of the rows written since, for up to INTERVAL seconds
# (an admin search makes what is left, for up to 2 s, before it searches).
RFTWEB_SEARCH_INDEX_INTERVAL = env_number("RFTWEB_SEARCH_INDEX_INTERVAL", 10, positive=True)
# Alerts (apps/alerts): links in them start with BASE_URL (where users reach this server); email
# goes through Django's mail backend (the console unless EMAIL_BACKEND names another: SMTP with
# EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS); webhooks to
# loopback and private addresses are refused unless WEBHOOK_PRIVATE. Beat checks for stalled runs
# and retries failed sends every ALERT_INTERVAL seconds.
RFTWEB_BASE_URL = os.environ.get("RFTWEB_BASE_URL", "http://localhost:8000")
RFTWEB_WEBHOOK_PRIVATE = env_bool("RFTWEB_WEBHOOK_PRIVATE", False)
RFTWEB_ALERT_INTERVAL = env_number("RFTWEB_ALERT_INTERVAL", 60, positive=True)
RFTWEB_WATCHDOG_INTERVAL = env_number("RFTWEB_WATCHDOG_INTERVAL", 30, positive=True)  # demo.pick_up embedded
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", str(DATA_DIR / "mail"))  # for the file backend
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(env_number("EMAIL_PORT", 25))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "rftweb@localhost")
CELERY_BEAT_SCHEDULE = {
    "alerts": {"task": "workers.tasks.alerts", "schedule": RFTWEB_ALERT_INTERVAL,
               "options": {"expires": RFTWEB_ALERT_INTERVAL}},
    "watchdog": {"task": "workers.tasks.watchdog", "schedule": RFTWEB_WATCHDOG_INTERVAL},
    # Always scheduled, a no-op while retention is off.
    "buffer-retention": {"task": "workers.tasks.buffer_retention", "schedule": RFTWEB_BUFFER_RETENTION_INTERVAL},
    "search-index": {  # a round that a busy worker could not start in time is dropped, not queued up
        "task": "workers.tasks.index_search", "schedule": RFTWEB_SEARCH_INDEX_INTERVAL,
        "options": {"expires": RFTWEB_SEARCH_INDEX_INTERVAL},
    },
}
# A run's worker beats every INTERVAL seconds; one silent for TIMEOUT seconds is presumed dead.
RFTWEB_HEARTBEAT_INTERVAL = float(os.environ.get("RFTWEB_HEARTBEAT_INTERVAL", 10))
RFTWEB_HEARTBEAT_TIMEOUT = float(os.environ.get("RFTWEB_HEARTBEAT_TIMEOUT", 120))
# How many times in a row the watchdog hands a dead worker's role on without a trainer step between;
# then the run fails for its user to resume (a worker killed at the same step each time: out of memory?).
RFTWEB_MAX_HANDOVERS = int(os.environ.get("RFTWEB_MAX_HANDOVERS", 3))
# The address other machines reach this one's trainer at (the ranks of a trainer on several
# machines, trainer.num_nodes; explorers receiving weights, synchronizer.method nccl): this host's
# name as it resolves here, unless set (to an address on the network they share).
RFTWEB_NODE_ADDRESS = os.environ.get("RFTWEB_NODE_ADDRESS") or socket.gethostbyname(socket.gethostname())
# How long a run's worker waits for a restarted database before leaving the run to the watchdog.
RFTWEB_DATABASE_OUTAGE_SECONDS = float(os.environ.get("RFTWEB_DATABASE_OUTAGE_SECONDS", 300))
# Annotation queue: how long an annotator holds an item, and how many annotators judge each one.
RFTWEB_ANNOTATION_LOCK_SECONDS = float(os.environ.get("RFTWEB_ANNOTATION_LOCK_SECONDS", 300))
RFTWEB_JUDGEMENTS_PER_ITEM = int(os.environ.get("RFTWEB_JUDGEMENTS_PER_ITEM", 1))
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Login throttling (apps.accounts.throttle): this many failed logins from one address, or for one
# account, within LOCKOUT_SECONDS of the first lock that address or account for LOCKOUT_SECONDS;
# every login there is refused meanwhile, the right password included.
RFTWEB_LOGIN_FAILURES_PER_ADDRESS = int(os.environ.get("RFTWEB_LOGIN_FAILURES_PER_ADDRESS", 50))
RFTWEB_LOGIN_FAILURES_PER_ACCOUNT = int(os.environ.get("RFTWEB_LOGIN_FAILURES_PER_ACCOUNT", 10))
RFTWEB_LOGIN_LOCKOUT_SECONDS = int(os.environ.get("RFTWEB_LOGIN_LOCKOUT_SECONDS", 15 * 60))
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("RFTWEB_STATIC_ROOT", DATA_DIR / "staticfiles"))  # images: outside the data volume
MEDIA_ROOT = DATA_DIR / "uploads"

# Uploads: big taskset files stream to disk rather than memory; the cap is checked by the view.
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
TASKSET_UPLOAD_MAX_BYTES = int(os.environ.get("TASKSET_UPLOAD_MAX_BYTES", 2 * 1024**3))
# The most bytes of one JSONL/CSV line or Parquet cell of a taskset (docs/security.md): 1 MiB,
# apps.tasksets.importers.DEFAULT_MAX_LINE_BYTES, the readers' own limit where none is given.
TASKSET_IMPORT_MAX_LINE_BYTES = int(env_number("TASKSET_IMPORT_MAX_LINE_BYTES", 1024 * 1024, positive=True))
# Rows of a file per committed batch of an import (a taskset's, expert data's: apps.core.hidden_imports),
# each its own write transaction: embedded SQLite's one write lock is held while a batch is
# inserted, beside a training run (measured with the demo run training: 2,000 rows held it 0.36 s on
# average, up to 2.0 s; 500 rows 0.06 s, up to 0.7 s; the 200k-row file took 36 s either way).
IMPORT_BATCH_ROWS = 500

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the websocket and fetch JS read it
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Scripts only from this site; see rftweb/csp.py. connect-src 'self' covers the same-host websockets.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
# Production (DEBUG off) is HTTPS only: `manage.py check --deploy` passes with no warning. Behind a
# TLS-terminating proxy set SECURE_PROXY_SSL_HEADER=1 (it must set X-Forwarded-Proto); for plain
# HTTP on a private network turn each of these off explicitly (docs/security.md).
if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", 365 * 24 * 3600))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)  # the header alone lists nothing
    if env_bool("SECURE_PROXY_SSL_HEADER", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # Django's own config gives "django" a console handler too, and its records propagated to the
    # root's: every request line of the dev server was printed twice. One handler, the root's.
    "filters": {"refusal_without_traceback": {"()": "rftweb.errors.RefusalWithoutTraceback"}},
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.request": {"filters": ["refusal_without_traceback"]},
    },
}
