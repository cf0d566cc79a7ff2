"""Telling a full disk apart from other write failures, and saying so.

A full disk surfaces differently in every writer a checkpoint goes through: ``OSError(ENOSPC)`` from
plain Python writes, a ``SafetensorError`` quoting "os error 28" from safetensors, and from ``torch.save``
only ``RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos ...`` with no word of disk
space at all. :func:`out_of_space` recognises all three (the last by the free space left on the
filesystem when it failed), so the message a user gets names the folder and the bytes free instead.
:func:`reported` does the same for the plain writes of ``muarl eval`` and ``muarl rollout``.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def out_of_space(err: BaseException, free: int, *, by_free_space: bool = True) -> bool:
    """Whether ``err`` (raised by a write, with ``free`` bytes left on its filesystem then) means a full disk.

    ``by_free_space=False`` takes only the error's own word for it (errno ENOSPC or EDQUOT, or a message
    saying so): for code whose failures are not all writes (an evaluation, whose policy may raise), where a
    ``RuntimeError`` on a nearly full disk need not be the disk's."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:  # the error and what it was raised from/during
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _SPACE_ERRNOS:
            return True
        if any(word in str(current).lower() for word in _SPACE_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return by_free_space and isinstance(err, (OSError, RuntimeError)) and free < NEARLY_FULL


def _failed_in(err: BaseException, folder: Path) -> Path:
    """The folder a failed write was in: the one its error names (a file's parent), else ``folder``."""
    current: BaseException | None = err
    while current is not None:
        name = getattr(current, "filename", None)
        if isinstance(name, (str, Path)) and name:
            path = Path(name)
            return path if path.is_dir() else path.parent
        current = current.__cause__ or current.__context__
    return Path(folder)


@contextmanager
def reported(folder: str | Path, doing: str, then: str | Callable[[], str]) -> Iterator[None]:
    """Turn a full disk inside the block into one :class:`OutOfSpace` line: what failed (``doing``), the
    folder and its free bytes, and ``then`` (what was kept and how to go on; a callable is asked only on a
    full disk). Any other error goes through as it was.
    """
    try:
        yield
    except OutOfSpace:
        raise
    except Exception as err:
        where = _failed_in(err, Path(folder))
        try:
            free = free_bytes(where)
        except OSError:
            free = -1
        if not out_of_space(err, free, by_free_space=False):
            raise
        left = f"{size_text(free)} free there" if free >= 0 else "free space unknown"
        raise OutOfSpace(f"out of disk space {doing} in {where}: {left}; "
                         f"{then() if callable(then) else then} ({type(err).__name__}: "
                         f"{' '.join(str(err).split())[:160]})") from err


def size_text(n: int) -> str:
    """Bytes for a message: exact, with a readable size beside large counts."""
    if n < 10_000:
        return f"{n} bytes"
    return f"{n} bytes ({n / 1e6:.1f} MB)" if n < 10**9 else f"{n} bytes ({n / 1e9:.1f} GB)"
