"""``muarl eval`` and ``muarl rollout`` into a full disk (issue 60, item 7): one line naming the folder, and
a rerun after freeing space resumes to what an uninterrupted run writes.

The full disk is a real 128 KB tmpfs mounted for the test where the machine allows it (root, or
CAP_SYS_ADMIN), grown with ``mount -o remount`` to "free space". Where it does not, the ``injected`` case
stands in (it runs everywhere, so CI always covers the path): a folder given a capacity, in which every
file opened for writing writes what still fits and then raises ``OSError(ENOSPC)`` (what a real full disk
does to a buffered write), and whose free space, as muarl measures it, is the capacity left. Before the fix
both commands ended in a 30-line ``OSError: [Errno 28] No space left on device`` traceback.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from muarl.cli import main
from muarl.rollout import load_trajectories
from muarl.time_split import without_time
from muarl.train import diskspace
from muarl.train.diskspace import OutOfSpace, reported, tree_size

SMALL, LARGE = 128 * 1024, 8 * 1024 * 1024


class _InjectedDisk:
    """A folder of ``size`` bytes by injection (see the module's docstring); ``grow`` frees space."""

    def __init__(self, folder: Path, size: int, monkeypatch: pytest.MonkeyPatch):
        self.folder, self.size = folder.resolve(), size
        real_open, real_free = builtins.open, diskspace.free_bytes
        disk = self

        class Capped:
            def __init__(self, f):
                self._f = f

            def write(self, text):
                self._f.flush()
                room = max(0, disk.size - tree_size(disk.folder))
                data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
                if len(data) > room:  # what fits goes in, as on a real disk; the rest fails
                    part = data[:room]
                    self._f.write(part.decode("utf-8", "ignore") if isinstance(text, str) else part)
                    self._f.flush()
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                return self._f.write(text)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._f.close()

            def __getattr__(self, name):
                return getattr(self._f, name)

        def capped_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            inside = isinstance(file, (str, Path)) and Path(file).resolve().is_relative_to(disk.folder)
            return Capped(f) if inside and any(c in mode for c in "wax") else f

        def free(path: Path) -> int:
            inside = Path(path).resolve().is_relative_to(disk.folder)
            return max(0, disk.size - tree_size(disk.folder)) if inside else real_free(path)

        monkeypatch.setattr(builtins, "open", capped_open)
        monkeypatch.setattr(io, "open", capped_open)  # Path.open goes through io.open
        monkeypatch.setattr(diskspace, "free_bytes", free)

    def grow(self, size: int) -> None:
        self.size = size


class _Tmpfs:
    def __init__(self, folder: Path, size: int):
        self.folder = folder
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]}); the injected case "
                        "covers this path")
        assert shutil.disk_usage(folder).total <= size + 4096

    def grow(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.folder)], check=True)

    def close(self) -> None:
        if subprocess.run(["umount", str(self.folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


@pytest.fixture(params=["tmpfs", "injected"])
def small_disk(request, tmp_path, monkeypatch):
    folder = tmp_path / "disk"
    folder.mkdir()
    if request.param == "injected":
        yield _InjectedDisk(folder, SMALL, monkeypatch)
        return
    if shutil.which("mount") is None:
        pytest.skip("no mount command; the injected case covers this path")
    disk = _Tmpfs(folder, SMALL)
    yield disk
    disk.close()


def _one_line_full_disk(err: str, doing: str, out: Path) -> int:
    """The error is one line naming ``out`` and the episodes kept; returns that count."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"muarl: error: out of disk space {doing} in {out}: "), err
    assert " bytes free there; the " in err and "free some space and rerun the same command to resume" in err
    kept = int(err.split("; the ", 1)[1].split(" ", 1)[0])
    assert f"finished episodes in {out / 'trajectories.jsonl'} are kept" in err
    return kept


EVAL = ["eval", "--domain", "retail", "--policy", "expert-noconfirm", "--k", "2", "--limit", "20", "--quiet",
        "--concurrency", "8"]
ROLLOUT = ["rollout", "--domain", "retail", "--n", "2", "--limit", "20", "--concurrency", "8"]


def test_eval_into_a_full_disk_is_one_line_and_the_rerun_resumes(tmp_path, small_disk, capsys):
    out = small_disk.folder / "run"
    assert main([*EVAL, "--out", str(out)]) == 2
    kept = _one_line_full_disk(capsys.readouterr().err, "writing the evaluation", out)
    assert 0 < kept < 40 and not (out / "results.json").exists()
    assert len(load_trajectories(out / "trajectories.jsonl")) == kept  # a torn last line is not an episode

    small_disk.grow(LARGE)
    assert main([*EVAL, "--out", str(out)]) == 0, capsys.readouterr().err
    assert main([*EVAL, "--out", str(tmp_path / "whole")]) == 0
    a, b = (json.loads((d / "results.json").read_text()) for d in (out, tmp_path / "whole"))
    assert a["timing"]["episodes_resumed"] == kept and a["timing"]["episodes_run"] == 40 - kept
    for key in ("config", "metrics", "families", "tasks"):
        assert a[key] == b[key], key
    after, whole = (load_trajectories(d / "trajectories.jsonl") for d in (out, tmp_path / "whole"))
    assert {k: without_time(t.model_dump()) for k, t in after.items()} == \
        {k: without_time(t.model_dump()) for k, t in whole.items()}


def test_rollout_into_a_full_disk_is_one_line_and_the_rerun_resumes(tmp_path, small_disk, capsys):
    out = small_disk.folder / "run"
    assert main([*ROLLOUT, "--out", str(out)]) == 2
    kept = _one_line_full_disk(capsys.readouterr().err, "writing the rollout", out)
    assert 0 < kept < 40 and not (out / "summary.json").exists()

    small_disk.grow(LARGE)
    assert main([*ROLLOUT, "--out", str(out)]) == 0, capsys.readouterr().err
    assert main([*ROLLOUT, "--out", str(tmp_path / "whole")]) == 0
    after, whole = (load_trajectories(d / "trajectories.jsonl") for d in (out, tmp_path / "whole"))
    assert len(after) == 40
    assert {k: without_time(t.model_dump()) for k, t in after.items()} == \
        {k: without_time(t.model_dump()) for k, t in whole.items()}
    summary, reference = (json.loads((d / "summary.json").read_text()) for d in (out, tmp_path / "whole"))
    assert summary == reference


def test_only_a_full_disk_is_reported_as_one(tmp_path, monkeypatch):
    """Any other error goes through as it was; a RuntimeError is not taken for a full disk by the free space
    alone (an evaluation's policy may raise one on a nearly full disk: here the disk reads as full)."""
    monkeypatch.setattr(diskspace, "free_bytes", lambda folder: 0)
    with pytest.raises(PermissionError), reported(tmp_path, "writing", "then"):
        raise PermissionError(errno.EACCES, "denied")
    with pytest.raises(RuntimeError, match="^boom$"), reported(tmp_path, "writing", "then"):
        raise RuntimeError("boom")
    full = rf"^out of disk space writing in {tmp_path / 'sub'}: .* free there; then \(OSError: \[Errno 28\] full: '.*file'\)$"
    with pytest.raises(OutOfSpace, match=full), reported(tmp_path, "writing", lambda: "then"):
        raise OSError(errno.ENOSPC, "full", str(tmp_path / "sub" / "file"))
