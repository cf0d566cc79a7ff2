"""Writing files and folders so that no reader, and no resumed run, ever sees half of one.

muarl rewrites files that something else may be reading or may resume from: metrics.jsonl on a resume, a
step's rollouts (the viewer polls them), a data set, an evaluation's results, a report page, a checkpoint's
manifest. Each is written beside its target under a temporary name and renamed over it. A rename within
one folder is atomic, so a kill leaves the old file or the new one, never a truncated one; the temporary
name is hidden and carries the process id, so it matches no reader's pattern (``step_*.jsonl``,
``*.json``) and two processes never write into the same one.

``durable=True`` also flushes the file and its folder to disk before returning (a checkpoint's manifest:
its presence vouches for the files it lists, so it must not outlive them in a power cut).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: a hidden sibling named for this process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextmanager
def atomic_open(path: str | Path, *, durable: bool = False) -> Iterator[TextIO]:
    """A text file (UTF-8) to write ``path`` through: it replaces ``path`` only when the block ends without
    an error (then the temporary file is removed and ``path`` is left as it was)."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write(path: str | Path, text: str, *, durable: bool = False) -> Path:
    """Write ``text`` to ``path`` (UTF-8) whole or not at all; returns ``path``."""
    with atomic_open(path, durable=durable) as f:
        f.write(text)
    return Path(path)


def write_lines(path: str | Path, lines: list[str]) -> Path:
    """A JSONL-style file: each line followed by a newline, written atomically."""
    return atomic_write(path, "".join(line + "\n" for line in lines))


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """A temporary folder to fill (a model's ``save_pretrained``); renamed to ``target`` when the block ends,
    so a half-written checkpoint is never picked up.

    When the rename fails because another process finished ``target`` first (it is there, not empty),
    theirs is kept and this copy removed; any other failure is raised.
    """
    target = Path(target)
    tmp = temporary_name(target)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target.is_dir() and any(target.iterdir())):
            raise


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_of(f: BinaryIO) -> str:
    """The SHA-256 of an open binary file from where it stands, read in 1 MiB chunks (``hashlib.file_digest``
    does this from Python 3.11 on; muarl supports 3.10)."""
    h = hashlib.sha256()
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()
