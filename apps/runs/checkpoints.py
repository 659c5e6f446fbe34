"""A run's checkpoints: where their directories may lie, the one a resumed run goes on from, and
downloads (a checkpoint directory streamed as an uncompressed tar).

Weights barely compress, so the tar is not gzipped: that keeps the CPU free and lets the response
announce its exact length (browsers show progress). Files are read in chunks, never whole, and
only regular files and directories are sent: a symlink could point anywhere on the server.
"""

import os
import re
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404

from .models import Checkpoint

CHUNK_BYTES = 1 << 20
BLOCK = tarfile.BLOCKSIZE


def run_dir(run) -> Path:
    """The run's work dir (weights versions, checkpoints). Named by id *and* creation time: ids are
    reused after a database reset, and a new run must never resume from an old run's files."""
    return settings.DATA_DIR / "runs" / f"{run.pk}-{run.created_at:%Y%m%dT%H%M%S%f}"


def checkpoint_dir(path: str) -> Path:
    """The checkpoint's directory, which must be one a trainer writes: <data dir>/runs/<a run's
    directory>/checkpoints/<one directory> (relative paths are taken from the data dir). Symlinks
    are resolved first, so a link cannot lead elsewhere. Anything else (the data dir itself held
    every run's files and uploads) is a PermissionDenied naming the rule."""
    data_dir = Path(settings.DATA_DIR).resolve()
    directory = (data_dir / path).resolve()
    if not directory.is_relative_to(data_dir):
        raise PermissionDenied("the checkpoint lies outside the data directory")
    parts = directory.relative_to(data_dir).parts
    if len(parts) != 4 or parts[0] != "runs" or parts[2] != "checkpoints":
        raise PermissionDenied("the checkpoint is not a directory of a run's checkpoints "
                               "(runs/<run>/checkpoints/<checkpoint> in the data directory)")
    if not directory.is_dir():
        raise Http404("the checkpoint directory no longer exists")
    return directory


def run_checkpoint_dir(checkpoint, run_directory: Path) -> Path:
    """checkpoint_dir, and inside `run_directory`, the checkpoint's own run's (supervision.run_dir):
    what a worker resumes from, and what a download of that run's checkpoint may send."""
    directory = checkpoint_dir(checkpoint.path)
    if directory.parent.parent != run_directory.resolve():
        raise PermissionDenied(f"checkpoint v{checkpoint.version} of run {checkpoint.run_id} lies outside that run's "
                               "own directory")
    return directory


def lock_loaded(paths: dict[str, str]) -> list[tuple[str, str]]:
    """Lock the Checkpoint rows of the trainer checkpoints (<data dir>/runs/<run>/checkpoints/step_N)
    that `paths` ({config key: resolved directory}) name or lie in, inside the caller's transaction,
    and say of each key whose checkpoint is no longer recorded, or whose directory is gone, why.
    A launch calls it right before it creates its run; keep_checkpoints' rotation takes the same
    row locks before it decides which checkpoints may go (store.DjangoCheckpointStore.forget), and
    deletes their directories only once their rows are gone. So a rotation either sees the new
    run and keeps the checkpoint, or went first and the launch is refused: never a run left naming
    a deleted directory (a launch between the rotation's check and its delete lost its model).
    (SQLite locks the whole database for a write instead: transaction_mode IMMEDIATE.)"""
    data_dir = Path(settings.DATA_DIR).resolve()
    named = {}
    for key, path in paths.items():
        parts = Path(path).relative_to(data_dir).parts if Path(path).is_relative_to(data_dir) else ()
        if (len(parts) >= 4 and parts[0] == "runs" and parts[2] == "checkpoints"
                and (step := re.fullmatch(r"step_(\d+)", parts[3])) and (run := re.match(r"(\d+)-", parts[1]))):
            named[key] = (data_dir.joinpath(*parts[:4]), int(run[1]), int(step[1]))
    if not named:
        return []
    wanted = Q()
    for _, run_id, step in named.values():
        wanted |= Q(run_id=run_id, step=step)
    recorded = {(row.run_id, row.step): row for row in
                Checkpoint.objects.select_for_update(of=("self",)).filter(wanted).select_related("run").order_by("pk")}
    problems = []
    for key, (directory, run_id, step) in named.items():
        row = recorded.get((run_id, step))
        if row is None or run_dir(row.run).name != directory.parent.parent.name:
            problems.append((key, f"checkpoint step_{step} of run {run_id} is no longer recorded: its run keeps only "
                                  "its newest trainer.keep_checkpoints (or it was deleted); name a newer one"))
        elif not directory.is_dir():
            problems.append((key, f"no model directory at {directory.relative_to(data_dir)}"))
    return problems


def resume_point(run, without=()):
    """The checkpoint a resumed run's trainer goes on from: its newest one by step, leaving out
    the checkpoints `without` (those a curator is about to delete: deletion.checkpoint_summary);
    None: it starts again from step 0."""
    return run.checkpoints.exclude(pk__in=[c.pk for c in without]).order_by("-step").first()


def forget_versions_after(run, version: int) -> None:
    """Drop the weight versions past `version` that the run's earlier life published (checkpoint
    sync: <run dir>/versions/v<n>), before a resume queues its duties: its trainer publishes them
    again as it replays. The trainer drops them too (Checkpointing.resume, start_over), but only
    once its model has loaded, and an explorer that started first could roll out on the old ones."""
    from workers.rft.synchronizer import Synchronizer  # the engine's module, with torch: only when resuming

    directory = run_dir(run) / "versions"
    if directory.is_dir():
        Synchronizer("checkpoint", directory=directory).discard_after(version)


def _members(root: Path, arcroot: str) -> Iterator[tuple[Path, tarfile.TarInfo]]:
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into linked directories
        directory = Path(dirpath)
        dirnames[:] = sorted(name for name in dirnames if not (directory / name).is_symlink())
        yield directory, _info(directory, PurePosixPath(arcroot, directory.relative_to(root)), tarfile.DIRTYPE)
        for name in sorted(filenames):
            path = directory / name
            if stat.S_ISREG(path.lstat().st_mode):
                yield path, _info(path, PurePosixPath(arcroot, path.relative_to(root)), tarfile.REGTYPE)


def _info(path: Path, arcname: PurePosixPath, kind: bytes) -> tarfile.TarInfo:
    status = path.lstat()
    info = tarfile.TarInfo(str(arcname))
    info.type = kind
    info.mtime = int(status.st_mtime)
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.size = status.st_size if kind == tarfile.REGTYPE else 0
    return info


def _padding(size: int) -> int:
    return -size % BLOCK


def tar_stream(root: Path, arcroot: str) -> tuple[Iterator[bytes], int]:
    """The chunks of a tar of root (members under arcroot/) and its size in bytes."""
    members = [
        (path, info, info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        for path, info in _members(root, arcroot)
    ]
    size = sum(len(header) + info.size + _padding(info.size) for _, info, header in members) + 2 * BLOCK

    def chunks():
        for path, info, header in members:
            yield header
            if info.isfile():
                yield from _file_chunks(path, info.size)
                yield bytes(_padding(info.size))
        yield bytes(2 * BLOCK)  # end of archive

    return chunks(), size


def _file_chunks(path: Path, size: int) -> Iterator[bytes]:
    """Exactly size bytes of the file: the header announced that many."""
    with path.open("rb") as file:
        remaining = size
        while remaining:
            chunk = file.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                raise OSError(f"{path} shrank while it was being sent")
            remaining -= len(chunk)
            yield chunk
