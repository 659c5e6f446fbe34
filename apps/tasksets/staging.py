"""An uploaded file kept across a form error, so the person does not choose it again.

Browsers never refill a file input. When the upload form comes back with an error (a taken name, a
bad field mapping) the file already sent is kept under MEDIA_ROOT/staged/, and the form carries a
signed token naming it. The token is bound to its user and lives STAGED_MAX_AGE; a kept file goes
once its import job has copied it, when its form sends another file, or when it is swept to make
room (below).

Room is bounded per person and in all (#41: ten refused 21 MB uploads left 213 MB here for 24 h).
A person's newest USER_MAX_FILES files of at most USER_MAX_BYTES together are kept: keeping
another sweeps their own oldest, and a file over USER_MAX_BYTES by itself is not kept (NotKept,
the page says so; it is never written here). Everyone's files together hold at most
TOTAL_MAX_BYTES: over it, the oldest are swept, whoever's. A swept file's form asks for the file
again, as an expired one's does.
"""

import secrets
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core import signing
from django.core.files import File
from django.template.defaultfilters import filesizeformat

STAGED_MAX_AGE = 24 * 3600  # a form left open over lunch still has its file
# A person fixing a form has one file in hand, two or three with tabs open; 64 MiB keeps a
# sizeable JSONL across a retry, and bigger files are chosen again rather than held for a day.
USER_MAX_FILES = 3
USER_MAX_BYTES = 64 * 1024**2
TOTAL_MAX_BYTES = 1024**3  # sixteen people at their cap
SALT = "apps.tasksets.staging"


class NotKept(Exception):
    """The file is not kept for the next try (the message says why, for the person)."""


@dataclass(frozen=True)
class Staged:
    token: str
    name: str  # the file's name on the person's machine
    path: Path

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    def open(self) -> File:
        return File(self.path.open("rb"), name=self.name)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def _directory() -> Path:
    return Path(settings.MEDIA_ROOT) / "staged"


def keep(upload, user, *, replacing: str = "") -> Staged:
    """Copy `upload` (in chunks) to the staging directory; the returned token names it for `user`.
    The file the token `replacing` names (the form's earlier one) goes in any case: another was
    chosen. NotKept, writing nothing, for a file over USER_MAX_BYTES."""
    if replaced := find(replacing, user):
        replaced.discard()
    if upload.size > USER_MAX_BYTES:
        raise NotKept(
            f"{filesizeformat(upload.size)} is more than the {filesizeformat(USER_MAX_BYTES)} kept for a person "
            "between tries, so this file is not kept: choose it again when you send the form."
        )
    directory = _directory()
    directory.mkdir(parents=True, exist_ok=True)
    _make_room(directory, user, upload.size)
    key = f"{user.pk}-{secrets.token_hex(16)}"  # the file's name on disk: never the person's name for it
    path = directory / key
    try:
        with path.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
    except BaseException:  # a full disk, a broken upload: no partial file left behind
        path.unlink(missing_ok=True)
        raise
    name = Path(upload.name).name
    token = signing.dumps({"key": key, "name": name, "user": user.pk}, salt=SALT)
    return Staged(token, name, path)


def find(token: str, user) -> Staged | None:
    """The file `token` names, if it is `user`'s, unexpired and still there."""
    try:
        data = signing.loads(token, salt=SALT, max_age=STAGED_MAX_AGE)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(data, dict) or data.get("user") != user.pk:
        return None
    path = _directory() / data["key"]  # signed by us, so a name we made and never a path
    return Staged(token, data["name"], path) if path.is_file() else None


def _make_room(directory: Path, user, size: int) -> None:
    """Delete expired files, then the oldest until `user` and everyone have room for `size` more."""
    files = _kept_files(directory)  # oldest first
    mine = [kept for kept in files if kept[0].name.startswith(f"{user.pk}-")]
    while mine and (len(mine) >= USER_MAX_FILES or sum(bytes_ for _, bytes_ in mine) + size > USER_MAX_BYTES):
        _delete(mine.pop(0), files)
    while files and sum(bytes_ for _, bytes_ in files) + size > TOTAL_MAX_BYTES:
        _delete(files[0], files)


def _kept_files(directory: Path) -> list[tuple[Path, int]]:
    """(path, size) of each unexpired kept file, oldest first; expired ones are deleted."""
    cutoff, files = time.time() - STAGED_MAX_AGE, []
    for path in directory.iterdir():
        with suppress(FileNotFoundError):  # another request deleted it first
            stat = path.stat()
            if stat.st_mtime < cutoff:
                path.unlink()
            else:
                files.append((stat.st_mtime, path, stat.st_size))
    return [(path, size) for _, path, size in sorted(files)]


def _delete(kept: tuple[Path, int], files: list) -> None:
    kept[0].unlink(missing_ok=True)
    with suppress(ValueError):
        files.remove(kept)
