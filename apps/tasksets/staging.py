"""An uploaded file kept across a form error, so the person does not choose it again.

Browsers never refill a file input. When the upload form comes back with an error (a taken name, a
bad field mapping) the file already sent is kept under MEDIA_ROOT/staged/, and the form carries a
signed token naming it. The token is bound to its user and lives STAGED_MAX_AGE; older staged files
are deleted whenever another is kept, and a kept file goes once its import job has copied it.
"""

import secrets
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core import signing
from django.core.files import File

STAGED_MAX_AGE = 24 * 3600  # a form left open over lunch still has its file
SALT = "apps.tasksets.staging"


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


def keep(upload, user) -> Staged:
    """Copy `upload` (in chunks) to the staging directory; the returned token names it for `user`."""
    directory = _directory()
    directory.mkdir(parents=True, exist_ok=True)
    _delete_expired(directory)
    key = secrets.token_hex(16)  # the file's name on disk: never the person's name for it
    path = directory / key
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
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
    path = _directory() / data["key"]  # signed by us, so a hex name and never a path
    return Staged(token, data["name"], path) if path.is_file() else None


def _delete_expired(directory: Path) -> None:
    cutoff = time.time() - STAGED_MAX_AGE
    for path in directory.iterdir():
        with suppress(FileNotFoundError):  # another request deleted it first
            if path.stat().st_mtime < cutoff:
                path.unlink()
