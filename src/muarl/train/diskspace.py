"""Telling a full disk apart from other write failures, and saying so.

A full disk surfaces differently in every writer a checkpoint goes through: ``OSError(ENOSPC)`` from
plain Python writes, a ``SafetensorError`` quoting "os error 28" from safetensors, and from ``torch.save``
only ``RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos ...`` with no word of disk
space at all. :func:`out_of_space` recognises all three (the last by the free space left on the
filesystem when it failed), so the message a user gets names the folder and the bytes free instead.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

#: a write that failed with less than this free on its filesystem is taken for a full disk
NEARLY_FULL = 1 << 20
_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_SPACE_WORDS = ("no space left", "os error 28", "os error 122", "disk quota exceeded", "storagefull")


class OutOfSpace(ValueError, OSError):
    """A save failed because the disk (or the quota) is full; its message names the folder and free bytes.

    An ``OSError`` (errno ENOSPC) to code that handles file-system failures, and a ``ValueError`` so that
    ``muarl``'s command line reports it as one line (exit status 2) rather than a traceback.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


def free_bytes(folder: Path) -> int:
    """Bytes available to this process on the filesystem holding ``folder`` (or its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def tree_size(folder: Path) -> int:
    """Total bytes of the files under ``folder`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).exists() else 0


def out_of_space(err: BaseException, free: int) -> bool:
    """Whether ``err`` (raised by a write, with ``free`` bytes left on its filesystem then) means a full disk."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:  # the error and what it was raised from/during
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _SPACE_ERRNOS:
            return True
        if any(word in str(current).lower() for word in _SPACE_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return isinstance(err, (OSError, RuntimeError)) and free < NEARLY_FULL


def size_text(n: int) -> str:
    """Bytes for a message: exact, with a readable size beside large counts."""
    if n < 10_000:
        return f"{n} bytes"
    return f"{n} bytes ({n / 1e6:.1f} MB)" if n < 10**9 else f"{n} bytes ({n / 1e9:.1f} GB)"
