"""A run's log: what its duties' workers logged while they served it, for the run page's Logs panel.

Each duty (supervision.serve) captures the lines logged while it serves the run, by supervision,
the engine (workers.rft) and anything they call, into a JSON-lines file of its own under
`<run dir>/logs/`. Files, not a table: the run's directory is in the data directory that the web
and every worker already share (checkpoints and weights are there), a log line costs an append
and no database round trip on the engine's hot path, and a burst of lines cannot swell the
database. Each file is capped at MAX_FILE_BYTES and rotated once (`<duty>.jsonl.1`), so a duty
keeps at most twice that.

Which lines are the duty's: one worker process may serve several runs at once (the embedded demo
server's threads; a threads pool), and a `loop` duty from offset 1 runs its explorer in a second
thread. So a line belongs to a duty when it is logged by the thread serving it or by a thread
started, directly or not, from that thread while it served (the heartbeat, the loop's explorer
thread, the synchronizer's threads). Python does not record a thread's parent: `Thread.start` is
wrapped once per process to hand the starting thread's duty on to the new thread.
Lines at INFO and above, whatever the worker's console prints (`celery worker -l`: make_info_records).

Lines are for every researcher watching the run: a known secret (the run's own, the server's keys
and database password) never reaches the file, nor does what follows "password=", "token: " and
the like, or the password in a URL; the server's own paths are cut as in the run's error.
"""
import json
import logging
import os
import re
import threading
import time
import traceback
from pathlib import Path

from django.conf import settings

MAX_FILE_BYTES = 256 * 1024  # per duty file; one rotated file beside it
MAX_MESSAGE_CHARS = 4000  # a message can quote a whole input back
MAX_TRACEBACK_CHARS = 16000
DEFAULT_LIMIT = 500  # lines a read returns
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LEVEL_NUMBERS = logging.getLevelNamesMapping()
REDACTED = "[redacted]"
# key=value, key: value, "key": "value" (Authorization: Bearer value) for the usual names of a credential.
CREDENTIAL = re.compile(
    r"""(?i)(["']?\b(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|authorization|bearer)\b["']?"""
    r"""\s*[=:]\s*(?:(?:bearer|basic|token)\s+)?|\bbearer\s+)(["']?)[^\s"',;]+"""
)
URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@", re.IGNORECASE)
# What a Celery worker's code prints arrives on this logger at WARNING (worker_redirect_stdouts_level),
# whatever it says: a print is no warning. And a progress bar's frames ("Writing model shards: 40%|")
# came twice a trainer step with checkpoint sync: 30 "warnings" of a walk's first minute, crowding out
# the run's real lines and its 256 KB file.
REDIRECTED = "celery.redirected"
PROGRESS_BAR = re.compile(r"\d+%\|.*\|")
MIN_SECRET_CHARS = 6  # shorter "secrets" (a test's "x") would blank ordinary words


def log_dir(work_dir: Path) -> Path:
    return work_dir / "logs"


# ---- which thread serves which duty ------------------------------------------------------------

_DUTY_ATTR = "rftweb_duty"  # on a Thread: the (run id, duty) it serves, or None
_plain_start = threading.Thread.start


def _start_with_duty(thread, *args, **kwargs):
    setattr(thread, _DUTY_ATTR, getattr(threading.current_thread(), _DUTY_ATTR, None))
    return _plain_start(thread, *args, **kwargs)


def follow_new_threads() -> None:
    """From now on (in this process) a thread serves the duty of the thread that started it."""
    threading.Thread.start = _start_with_duty


def serving_duty():
    """The (run id, duty) the current thread serves, or None."""
    return getattr(threading.current_thread(), _DUTY_ATTR, None)


# ---- writing ------------------------------------------------------------------------------------


def make_info_records() -> None:
    """From now on (in this process) INFO records are made whatever its console prints. Celery sets
    the root logger to its `-l` level, WARNING unless told: a worker started the README's way
    (`celery -A rftweb worker -Q train`) made none of its duties' info lines, and the Logs panel of
    a run handed over to it showed nothing from it ("resumed from checkpoint v70" nor "stopped at
    trainer step 92"). So the root goes down to INFO and the handlers it had (the console) up to
    the level it had: they print what they printed."""
    root = logging.getLogger()
    if root.level <= logging.INFO:  # NOTSET (0) too: the root makes every record
        return
    for handler in root.handlers:
        handler.setLevel(max(handler.level, root.level))
    root.setLevel(logging.INFO)


class DutyLog(logging.Handler):
    """Captures, while it is open, the lines of the duty served by the thread that opened it (and
    the threads it starts) into `<work dir>/logs/<duty>.jsonl`. Use as a context manager."""

    def __init__(self, work_dir: Path, run_id: int, duty: str, secrets=(), clean=lambda text: text):
        super().__init__(level=logging.INFO)
        self.path = log_dir(work_dir) / f"{duty}.jsonl"
        self.tag = (run_id, duty)
        self.duty = duty
        self.clean = clean
        self.secrets = sorted(
            {s for s in (*secrets, *server_secrets()) if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True
        )
        self.file = None
        self.thread = None
        self.formatter = logging.Formatter()

    def __enter__(self):
        follow_new_threads()
        make_info_records()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")
        self.thread = threading.current_thread()
        self.before = getattr(self.thread, _DUTY_ATTR, None)
        setattr(self.thread, _DUTY_ATTR, self.tag)
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeHandler(self)
        setattr(self.thread, _DUTY_ATTR, self.before)
        with self.lock:
            self.file.close()
        return False

    def filter(self, record):
        if serving_duty() != self.tag:
            return False
        if record.name == REDIRECTED and PROGRESS_BAR.search(record.getMessage()):
            return False
        return super().filter(record)

    def emit(self, record):
        try:
            line = json.dumps(self.entry(record), ensure_ascii=False) + "\n"
            with self.lock:  # this duty's threads write one file
                if self.file.tell() + len(line) > MAX_FILE_BYTES:
                    self.file.close()
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                    self.file = self.path.open("a", encoding="utf-8")
                self.file.write(line)
                self.file.flush()  # the page reads it from another process, maybe another machine
        except Exception:  # noqa: BLE001 - a log line must never break the run
            self.handleError(record)

    def entry(self, record) -> dict:
        message = self.scrub(record.getMessage())
        entry = {
            "time": record.created,
            "level": "INFO" if record.name == REDIRECTED else record.levelname,
            "logger": record.name,
            "duty": self.duty,
            "thread": threading.current_thread().name,
            "message": cut(message, MAX_MESSAGE_CHARS),
        }
        if record.exc_info:
            folded = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            entry["traceback"] = cut(self.scrub(folded), MAX_TRACEBACK_CHARS)
        return entry

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = CREDENTIAL.sub(lambda m: m[1] + m[2] + REDACTED, text)
        text = URL_PASSWORD.sub(lambda m: m[1] + REDACTED + "@", text)
        return self.clean(text)


def server_secrets() -> list[str]:
    """What the server itself keeps secret and a line could quote: its signing key, its database's
    and Redis's passwords."""
    found = [settings.SECRET_KEY]
    found += [db.get("PASSWORD") or "" for db in settings.DATABASES.values()]
    redis = re.match(r"[a-z]+://[^:@/]*:([^@/]+)@", getattr(settings, "REDIS_URL", "") or "")
    return found + ([redis[1]] if redis else [])


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters cut]"


# ---- reading ------------------------------------------------------------------------------------


def read(work_dir: Path, level: str = "info", limit: int = DEFAULT_LIMIT) -> dict:
    """The run's lines at `level` or above, errors and warnings first (newest first), then the
    others, newest first; at most `limit`. With the count of lines at each level and the duties
    that logged. ValueError naming the known levels for another `level`."""
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}: one of {', '.join(LEVELS)}")
    lines, duties = [], set()
    directory = log_dir(work_dir)
    for path in sorted(directory.glob("*.jsonl*")) if directory.is_dir() else ():
        for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue  # a line cut short by a worker that died mid-write
            lines.append(line)
            duties.add(line.get("duty"))
    counts = {}
    for line in lines:
        counts[line["level"]] = counts.get(line["level"], 0) + 1
    shown = [line for line in lines if number(line) >= LEVELS[level]]
    shown.sort(key=lambda line: (-tier(line), -line["time"]))
    return {"lines": shown[:limit], "shown": min(len(shown), limit), "matching": len(shown), "counts": counts,
            "duties": sorted(d for d in duties if d), "read_at": time.time()}


def number(line: dict) -> int:
    return LEVEL_NUMBERS.get(line.get("level"), logging.INFO)


def tier(line: dict) -> int:
    """2 for errors (and critical), 1 for warnings, 0 for the rest: the order a read shows them in."""
    return 2 if number(line) >= logging.ERROR else int(number(line) >= logging.WARNING)


TAIL_BYTES = 64 * 1024  # of each duty file a worker's page reads: ~250 lines, not the 512 KB a duty keeps


def tail(work_dir: Path, duty: str, since: float, until: float | None, limit: int) -> list[dict]:
    """The newest `limit` lines of one duty's file (and its rotated one) logged from `since` to
    `until` (Unix seconds; None: now), oldest first: what one worker logged while it held the duty
    (the file is the duty's, whoever served it). Only the files' last TAIL_BYTES are read: the
    Workers page asks every 5 s."""
    found = []
    directory = log_dir(work_dir)
    for path in (directory / f"{duty}.jsonl.1", directory / f"{duty}.jsonl"):
        try:
            with path.open("rb") as file:
                start = max(0, file.seek(0, os.SEEK_END) - TAIL_BYTES)
                file.seek(start)
                lines = file.read().decode("utf-8", errors="replace").splitlines()
        except OSError:  # no such file yet
            continue
        for raw in lines[1:] if start else lines:  # the first, cut by the seek
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line a dying worker cut short
            if isinstance(line, dict) and since <= line.get("time", 0) <= (until or float("inf")):
                found.append(line)
    return found[-limit:]
