"""Faults in a run's files (issue 20, items 1, 5, 6): damaged checkpoints, a full disk, inputs written.

Every run here is a real SFT run of the ``tiny-random`` model (two optimizer steps, one checkpoint per
step), damaged with real file operations: bytes flipped, a file cut short, a file overwritten with noise,
the manifest deleted. The full disk is a real 8 MB tmpfs mounted for the test when the machine allows it
(root, or CAP_SYS_ADMIN); where it does not, :class:`_InjectedDisk` stands in: a folder given a capacity
whose ``torch.save`` calls fail with ``OSError(ENOSPC)`` once the folder would exceed it, and whose free
space (as muarl measures it) is the capacity left. Each test fails on muarl before these fixes.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from muarl.train import checkpoint as ckpt
from muarl.train import diskspace, weights
from muarl.train.checkpoint import NoIntactCheckpoint, choose_resume, list_checkpoints
from muarl.train.diskspace import OutOfSpace, tree_size
from muarl.train.manifest import MANIFEST, STATE_KEY, check_checkpoint
from train_fixtures import write_sft_data

TESTS = Path(__file__).parent
ROOT = TESTS.parent
TIMING = ("tokens_per_s", "peak_rss_gb", "peak_rss_gb_mean", "peak_gpu_gb")  # measured: never equal across runs
SETTINGS = dict(model="tiny-random", epochs=1, batch_size=3, max_len=8192, save_every=1, keep_checkpoints=0,
                report_to="none")


def _config(data: Path, out: Path, **overrides):
    from muarl.train.sft import preset

    return preset("tiny", data=[str(data)], out=str(out), **{**SETTINGS, **overrides})


def _train(data: Path, out: Path, **overrides) -> dict:
    from muarl.train.sft import train_sft

    return train_sft(_config(data, out, **overrides), progress=False)


def _metrics(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    return write_sft_data(tmp_path_factory.mktemp("data") / "sft.jsonl")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, sft_data) -> Path:
    """An uninterrupted two-step run: checkpoints step_1 and step_2, the final model, its metrics."""
    out = tmp_path_factory.mktemp("whole") / "run"
    data_before = sft_data.read_bytes()
    result = _train(sft_data, out)
    assert result["steps"] == 2 and [s for s, _ in list_checkpoints(out)] == [1, 2]
    assert sft_data.read_bytes() == data_before  # training data is read, never written
    return out


def _copy(whole: Path, to: Path, steps: tuple[int, ...] = (1, 2)) -> Path:
    """The run directory as a run killed after saving ``steps`` leaves it (no final model)."""
    to.mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy2(whole / name, to / name)
    for step in steps:
        shutil.copytree(whole / "checkpoints" / f"step_{step}", to / "checkpoints" / f"step_{step}")
    return to


def _flip(path: Path) -> None:
    """Invert 16 bytes in the middle of the file (inside tensor data for weights): same size, loads fine."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble(path: Path) -> None:
    path.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(path.stat().st_size)))


DAMAGE = {
    "flipped": (_flip, "model/model.safetensors", "does not match its SHA-256"),
    "truncated": (_truncate, "trainer_state.pt", "(truncated)"),
    "garbled": (_garble, "rng_rank0.pt", "does not match its SHA-256"),
    "no-manifest": (lambda p: p.unlink(), MANIFEST, f"{MANIFEST} is missing"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_and_says_which_file(
        kind, tmp_path, sft_data, whole, capfd):
    """Before: flipped bytes resumed silently (exit 0, a diverged run); a truncated or garbled file gave a
    raw torch traceback; a checkpoint without its manifest was used as if complete."""
    damage, name, says = DAMAGE[kind]
    out = _copy(whole, tmp_path / "run")
    damage(out / "checkpoints" / "step_2" / name)
    result = _train(sft_data, out)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "step_2 is damaged" in line]
    assert len(lines) == 1 and name in lines[0] and says in lines[0] and "resuming from step_1" in lines[0], err
    # step 2 was trained again from step 1: the run ends exactly where the uninterrupted one did
    assert result["steps"] == 2 and _metrics(out) == _metrics(whole)
    assert _same_weights(out, whole)
    assert (out / "checkpoints" / "damaged-step_2").is_dir()  # kept for inspection, out of resume's way
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    assert check_checkpoint(out / "checkpoints" / "step_2").problem is None


def test_no_intact_checkpoint_stops_with_the_reason_exit_2_no_traceback(tmp_path, sft_data, whole):
    """Before: both checkpoints damaged, the run resumed from the flipped one and exited 0."""
    out = _copy(whole, tmp_path / "run")
    _flip(out / "checkpoints" / "step_1" / "model" / "model.safetensors")
    _truncate(out / "checkpoints" / "step_2" / "trainer_state.pt")
    cmd = [sys.executable, "-m", "muarl", "sft", "--preset", "tiny", "--model", "tiny-random", "--data",
           str(sft_data), "--out", str(out), "--epochs", "1", "--batch-size", "3", "--max-len", "8192",
           "--save-every", "1", "--keep-checkpoints", "0", "--report-to", "none", "--no-progress"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("muarl: error:")]
    assert len(error) == 1 and "no intact checkpoint" in error[0], done.stderr
    for part in ("step_2: trainer_state.pt", "(truncated)", "step_1: model/model.safetensors", "--no-resume"):
        assert part in error[0]
    # nothing was moved or deleted: the user decides
    assert [s for s, _ in list_checkpoints(out)] == [1, 2] and not (out / "model").exists()
    with pytest.raises(NoIntactCheckpoint, match="no intact checkpoint"):
        choose_resume(out)


def _as_older_muarl(path: Path) -> None:
    """What a muarl before manifests wrote: no manifest.json, a state.json without the manifest key."""
    (path / MANIFEST).unlink()
    state = json.loads((path / "state.json").read_text())
    del state[STATE_KEY]
    (path / "state.json").write_text(json.dumps(state, indent=1) + "\n")


def test_checkpoints_of_an_older_muarl_resume_with_a_warning_only_if_their_files_load(
        tmp_path, sft_data, whole, capfd):
    """Before: a manifest-less checkpoint was trusted without a word, and a truncated one crashed in torch."""
    out = _copy(whole, tmp_path / "run")
    for step in (1, 2):
        _as_older_muarl(out / "checkpoints" / f"step_{step}")
    _truncate(out / "checkpoints" / "step_2" / "model" / "model.safetensors")
    result = _train(sft_data, out)
    err = capfd.readouterr().err
    assert "step_2 is damaged: model/model.safetensors does not load" in err, err
    assert "older muarl" in err and "resuming from step_1" in err
    assert "step_1 has no manifest.json (saved by an older muarl)" in err  # trusted, and said so
    assert result["steps"] == 2 and _metrics(out) == _metrics(whole) and _same_weights(out, whole)
    assert check_checkpoint(out / "checkpoints" / "step_2").problem is None  # the new save has a manifest


# -- a full disk --------------------------------------------------------------------------------------------


class _InjectedDisk:
    """A folder of limited capacity, for machines that cannot mount a tmpfs (documented write injection).

    ``torch.save`` into the folder raises ``OSError(ENOSPC)`` when the folder would exceed ``size`` bytes,
    and muarl's free-space measure reports the capacity left; other writers are not limited (a checkpoint's
    largest file, the optimizer state, goes through ``torch.save``).
    """

    def __init__(self, folder: Path, size: int, monkeypatch: pytest.MonkeyPatch):
        self.folder, self.size = folder.resolve(), size
        real_save, real_free = torch.save, diskspace.free_bytes

        def free(path: Path) -> int:
            inside = Path(path).resolve().is_relative_to(self.folder)
            return max(0, self.size - tree_size(self.folder)) if inside else real_free(path)

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)) and Path(f).resolve().is_relative_to(self.folder):
                buffer = io.BytesIO()
                real_save(obj, buffer, *args, **kwargs)
                if tree_size(self.folder) + buffer.tell() > self.size:
                    raise OSError(errno.ENOSPC, "No space left on device (injected)", str(f))
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
        for module in (diskspace, ckpt, weights):
            monkeypatch.setattr(module, "free_bytes", free)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """``make(size)``: a folder on a filesystem of ``size`` bytes (a real tmpfs where mounting works)."""
    mounted: list[Path] = []

    def make(size: int) -> Path:
        folder = tmp_path / "disk"
        folder.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                                  capture_output=True).returncode
        except OSError:  # no mount command
            done = -1
        if done == 0:
            mounted.append(folder)
            assert shutil.disk_usage(folder).total <= size + 4096
        else:
            _InjectedDisk(folder, size, monkeypatch)
        return folder

    yield make
    for folder in mounted:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _disk_size(whole: Path) -> int:
    """Room for one checkpoint and the final model, not for two checkpoints."""
    one, final = tree_size(whole / "checkpoints" / "step_1"), tree_size(whole / "model")
    assert final < one
    return (one + final + (one - final) // 2) // 4096 * 4096


def test_a_save_into_a_full_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path, sft_data, whole,
                                                                            small_disk):
    """Before: ``RuntimeError: [enforce fail at inline_container.cc:...]`` with no word of disk space."""
    disk = small_disk(_disk_size(whole))
    out = _copy(whole, disk / "run", steps=(1,))
    with pytest.raises(OutOfSpace) as caught:
        _train(sft_data, out)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("out of disk space saving checkpoint step_2 in ")
    assert re.search(rf"in {re.escape(str(out / 'checkpoints'))}: \d+ bytes( \(.*?\))? free there", message)
    assert "the previous checkpoint step_1 is intact" in message
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_1"]  # the partial save is gone
    assert check_checkpoint(out / "checkpoints" / "step_1").problem is None
    assert diskspace.free_bytes(out) > tree_size(whole / "model")  # its space was given back


def test_keep_checkpoints_prunes_before_the_save_when_the_disk_is_short(tmp_path, sft_data, whole, small_disk,
                                                                        capfd):
    """Before: pruning ran only after a save, so ``--keep-checkpoints 1`` ran out of space the same way."""
    disk = small_disk(_disk_size(whole))
    out = _copy(whole, disk / "run", steps=(1,))
    result = _train(sft_data, out, keep_checkpoints=1)
    err = capfd.readouterr().err
    assert "pruning checkpoint step_1 before saving step_2 to make room (--keep-checkpoints 1;" in err, err
    assert result["steps"] == 2 and _metrics(out) == _metrics(whole) and _same_weights(out, whole)
    assert [s for s, _ in list_checkpoints(out)] == [2]
    assert check_checkpoint(out / "checkpoints" / "step_2").problem is None


def test_room_enough_prunes_only_after_the_save(tmp_path, sft_data, whole, capfd):
    """With space to spare the old checkpoint stays until the new one is complete (a kill keeps one)."""
    out = _copy(whole, tmp_path / "run", steps=(1,))
    _train(sft_data, out, keep_checkpoints=1)
    assert "pruning" not in capfd.readouterr().err
    assert [s for s, _ in list_checkpoints(out)] == [2]


def test_writing_the_final_model_into_a_full_disk_says_so(tmp_path, small_disk):
    from muarl.models import load

    model, tokenizer = load("tiny-random")
    disk = small_disk(1 << 20)  # the weights alone are 1.5 MB
    if not os.path.ismount(disk):
        pytest.skip("needs a mounted tmpfs (the final model is written by safetensors, not torch.save)")
    with pytest.raises(OutOfSpace, match=r"^out of disk space writing the trained model in .*: \d+ bytes( \(.*?\))? free there"):
        weights.save_final(disk / "run", model, tokenizer)


# -- inputs are read-only -----------------------------------------------------------------------------------


def test_a_replay_run_never_writes_its_input_file(tmp_path):
    """Before: a torn last line was cut from the user's own replay file (resume repair meant for outputs)."""
    from muarl.cli import main
    from muarl.evaluate import result_from_trajectories

    recorded = tmp_path / "recorded"
    assert main(["rollout", "--domain", "retail", "--limit", "2", "--out", str(recorded)]) == 0
    replay = recorded / "trajectories.jsonl"
    text = replay.read_text()
    replay.write_text(text + text.splitlines()[0][:80])  # a torn last line, as a killed run leaves it
    before = replay.read_bytes()
    out = tmp_path / "replayed"
    assert main(["rollout", "--domain", "retail", "--limit", "2", "--user", f"replay:{replay}",
                 "--out", str(out)]) == 0
    assert replay.read_bytes() == before
    assert json.loads((out / "summary.json").read_text())["episodes"] == 2
    result_from_trajectories(replay)  # reading a run's trajectories (a report) never repairs them either
    assert replay.read_bytes() == before
