"""A duty's failure, as its user reads it on the run page (the cause and what to do, no
traceback, no server paths), and which failures are a broken rank group rather than the run's."""
import errno
import os
import re
import shutil
import sys
from pathlib import Path

from django.conf import settings

DISK_FULL_MARKS = ("No space left on device", "StorageFull", "file write failed")
MAX_CAUSE_CHARS = 1000  # an exception can quote a whole input back


def describe_failure(duty: str, exc: BaseException, work_dir: Path) -> str:
    """The run's error, as every researcher watching the run reads it: the cause and what to do.
    The traceback is not part of it (it names the server's files and code): serve logs it in the
    worker's log. A full disk surfaces as OSError, torch's RuntimeError or safetensors' own error:
    look at the error's text and at the disk itself."""
    disk_full = getattr(exc, "errno", None) == errno.ENOSPC or any(mark in str(exc) for mark in DISK_FULL_MARKS)
    if disk_full or free_bytes(work_dir) < 1024 * 1024:
        return (
            f"{duty} failed: the disk holding the run's directory ({without_server_paths(work_dir)} in the data "
            "directory) is full (no space left on device). Free space there, then resume the run: it continues "
            "from its last checkpoint."
        )
    cause = without_server_paths(f"{type(exc).__name__}: {exc}")
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[:MAX_CAUSE_CHARS] + " [...]"
    return (
        f"{duty} failed: {cause}\n\nThe traceback is in the worker's log, for the server's administrators. "
        "Fix the cause, then resume the run: it continues from its last checkpoint."
    )


def describe_lost_worker(duty: str, cause: str, times: int, step: int) -> str:
    """The run's error once the worker process serving `duty` died under it `times` times in a row
    with no step done between (the run at trainer step `step`); `cause` is Celery's WorkerLostError
    ("Worker exited prematurely: signal 9 (SIGKILL) Job: 3."). Signal 9 comes from outside the
    process: most often the kernel's out-of-memory killer, which says so in the machine's kernel log."""
    signal = re.search(r"signal (\d+)(?: \((\w+)\))?", cause)
    code = re.search(r"exitcode (-?\d+)", cause)
    times_ = "twice" if times == 2 else f"{times} times"
    if signal and signal[1] == "9":
        how = f"killed {times_} (signal 9: out of memory?)"
        advice = ("The kernel kills a process with signal 9 when its machine runs out of memory (`dmesg` on the "
                  "worker's machine names the out-of-memory killer): serve the run on workers with more memory, or "
                  "make it smaller (the model, explorer.batch_size, trainer.micro_batch_size), then resume it")
    else:
        what = (f"signal {signal[1]}{f', {signal[2]}' if signal[2] else ''}" if signal
                else f"exit code {code[1]}" if code else "cause unknown")
        how = f"{'killed' if signal else 'lost'} {times_} ({what})"
        advice = "The worker's log says what happened; fix the cause, then resume the run"
    return (
        f"{duty} failed: the worker serving {duty} was {how}, with no step done in between (the run is at "
        f"trainer step {step}), so it is not handed to another worker again. {advice}: it continues from its "
        "last checkpoint."
    )


def without_server_paths(text) -> str:
    """Paths in the data directory as the user knows them (relative to it); the server's own
    directories (the code, Python's install) not at all."""
    text = str(text)
    for directory, shown_as in (
        (settings.DATA_DIR, ""),
        (settings.BASE_DIR, "<rftweb>/"),
        (Path(sys.prefix), "<python>/"),
        (Path(sys.base_prefix), "<python>/"),
    ):
        text = text.replace(f"{directory}{os.sep}", shown_as).replace(str(directory), shown_as or ".")
    return text


def free_bytes(path: Path) -> float:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return float("inf")


def is_rank_failure(exc: BaseException) -> bool:
    """A rank of the trainer died or hung (distributed.RankFailure), here or on another machine,
    or an explorer of its weight group did (weight_manifest.WeightSyncError)."""
    failures = []
    if "workers.rft.distributed" in sys.modules:  # else torch was not even loaded: no group ran here
        from workers.rft.distributed import RankFailure

        failures.append(RankFailure)
    if "workers.rft.weight_manifest" in sys.modules:
        from workers.rft.weight_manifest import WeightSyncError

        failures.append(WeightSyncError)
    return isinstance(exc, tuple(failures))
