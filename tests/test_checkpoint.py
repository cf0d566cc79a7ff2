"""Checkpoints: a run killed with SIGKILL and resumed equals one never interrupted; saves are atomic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from muarl.time_split import is_timing
from muarl.train.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
from muarl.train.distributed import Dist
from muarl.train.run import open_run
from train_fixtures import write_sft_data

TESTS = Path(__file__).parent
# measured, not computed: what the machine did (seconds, resident memory), never equal across two runs
#: a step metric that measures time, speed or memory: never equal across runs of one command
TIMING = is_timing


def _metrics(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not TIMING(k)}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def _grpo_cmd(out: Path) -> list[str]:
    # groups of 2 with DAPO refill: about half the groups are all-equal, so steps play a varying number of
    # tasks and the resumed run must find its data position from the metrics it restored; two updates per
    # step, so the optimizer state saved is that of several steps on one step's rollouts
    return [sys.executable, "-m", "muarl", "grpo", "--preset", "tiny", "--domain", "train_fixtures:coin",
            "--out", str(out), "--steps", "4", "--tasks-per-step", "3", "--group-size", "2",
            "--dynamic-sampling", "--max-rollout-batches", "3", "--num-iterations", "2",
            "--max-new-tokens", "16", "--max-turns", "3", "--lr", "3e-3", "--save-every", "1",
            "--keep-checkpoints", "0", "--no-progress"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_grpo_killed_with_sigkill_resumes_to_the_same_metrics_weights_and_rollouts(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(_grpo_cmd(whole), env=_env(), check=True, capture_output=True, timeout=300)

    proc = subprocess.Popen(_grpo_cmd(killed), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (killed / "checkpoints" / "step_2").exists():
            assert proc.poll() is None, "the run ended before its second checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert latest_checkpoint(killed)[0] in (2, 3)  # killed before the end: steps remain to be played
    resumed = subprocess.run(_grpo_cmd(killed), env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    expected = _metrics(whole)
    assert [m["step"] for m in expected] == [1, 2, 3, 4]
    # the test is only worth something if the updates did something (a step trains when one of its up to
    # nine groups of two disagrees) and refills happened (steps played more than three tasks)
    assert sum(m["grad_norm"] > 0 for m in expected) >= 3 and any(m["kl"] > 0 for m in expected)
    assert any(m["tasks_played"] > 3 for m in expected) and len({m["tasks_played"] for m in expected}) > 1
    assert _metrics(killed) == expected  # every metric of every step, bit for bit (timings aside)
    a, b = load_file(whole / "model" / "model.safetensors"), load_file(killed / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(whole / "checkpoints" / "step_1" / "model" / "model.safetensors")
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the weights moved after step 1
    for step in range(1, 5):
        name = f"rollouts/step_{step:06d}.jsonl"
        ours = [json.loads(line) for line in (killed / name).read_text().splitlines()]
        theirs = [json.loads(line) for line in (whole / name).read_text().splitlines()]
        assert [(t["token_ids"], t["reward"]["reward"], t["metadata"]["advantage"]) for t in ours] == \
               [(t["token_ids"], t["reward"]["reward"], t["metadata"]["advantage"]) for t in theirs]
        assert {t["metadata"]["step"] for t in ours} == {step}
        assert sorted((t["metadata"]["group"], t["metadata"]["member"]) for t in ours) == \
               [(g, m) for g in range(expected[step - 1]["tasks_played"]) for m in range(2)]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    return write_sft_data(tmp_path_factory.mktemp("sft") / "sft.jsonl")


@pytest.mark.slow
def test_sft_resumed_after_a_kill_equals_the_uninterrupted_run(tmp_path, sft_data):
    """The state a kill leaves: checkpoints up to step 2, metrics lines of later steps, a half-written save."""
    import shutil

    from muarl.train.sft import preset, train_sft

    def config(out):
        return preset("tiny", data=[str(sft_data)], out=str(out), epochs=2, batch_size=3, max_len=8192,
                      save_every=1, keep_checkpoints=0, report_to="tensorboard")

    whole = train_sft(config(tmp_path / "whole"), progress=False)
    assert whole["steps"] == 4 and whole["metrics"][-1]["loss"] < whole["metrics"][0]["loss"]
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "whole", crashed)
    for step in (3, 4):
        shutil.rmtree(crashed / "checkpoints" / f"step_{step}")
    shutil.rmtree(crashed / "model")
    (crashed / "checkpoints" / ".tmp-step_3").mkdir()  # killed in the middle of saving step 3
    assert len(_metrics(crashed)) == 4  # the killed run had logged step 3 (and 4) after its last save
    resumed = train_sft(config(crashed), progress=False)
    assert _metrics(crashed) == _metrics(tmp_path / "whole")
    assert [m["loss"] for m in resumed["metrics"]] == [m["loss"] for m in whole["metrics"]]
    assert not (crashed / "checkpoints" / ".tmp-step_3").exists()
    a, b = (load_file(p / "model" / "model.safetensors") for p in (tmp_path / "whole", crashed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the schedule resumed too: the learning rate of step 3 is the cosine's, not the warm-up's again
    assert resumed["metrics"][2]["lr"] == whole["metrics"][2]["lr"]


@dataclass
class _Config:
    out: str
    lr: float = 1e-3
    steps: int = 4
    seed: int = 0
    resume: bool | None = None


def _fake_checkpoint(out: Path, step: int) -> Path:
    return save_checkpoint(out, step, Dist(), lambda d: (d / "model").mkdir(), {"step": step, "metrics": []})


def test_resume_is_automatic_refuses_a_changed_config_and_no_resume_starts_over(tmp_path):
    run = open_run(_Config(str(tmp_path)), Dist())
    assert run.resume_from is None and run.start_step == 0
    _fake_checkpoint(tmp_path, 2)
    _fake_checkpoint(tmp_path, 5)
    run = open_run(_Config(str(tmp_path), steps=10), Dist())  # more steps: allowed
    assert run.start_step == 5 and run.resume_from == tmp_path / "checkpoints" / "step_5"
    with pytest.raises(ValueError, match=r"lr: 0.001 -> 0.01"):
        open_run(_Config(str(tmp_path), lr=1e-2), Dist())
    # a run recorded before a config field existed resumes when the field keeps its default
    recorded = json.loads((tmp_path / "config.json").read_text())
    del recorded["lr"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    assert open_run(_Config(str(tmp_path)), Dist()).start_step == 5
    run = open_run(_Config(str(tmp_path), lr=1e-2, resume=False), Dist())
    assert run.start_step == 0 and list_checkpoints(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        open_run(_Config(str(tmp_path), resume=True), Dist())


def test_a_failed_save_leaves_the_previous_checkpoint_and_old_ones_are_pruned(tmp_path):
    _fake_checkpoint(tmp_path, 1)

    def dies(directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "model" / "half.bin").write_bytes(b"x" * 100)
        raise KeyboardInterrupt  # stands in for a kill during the write

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, Dist(), dies, {"step": 2})
    assert latest_checkpoint(tmp_path)[0] == 1  # the half-written step 2 is invisible
    open_run(_Config(str(tmp_path)), Dist())  # the next start clears the debris
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_1"]
    for step in (2, 3, 4):
        save_checkpoint(tmp_path, step, Dist(), lambda d: (d / "model").mkdir(), {"step": step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    state = json.loads((tmp_path / "checkpoints" / "step_4" / "state.json").read_text())
    assert state["step"] == 4 and state["world_size"] == 1


def test_a_resume_whose_data_changed_is_refused_and_its_checkpoints_kept(tmp_path, sft_data, capsys):
    """``provenance.json`` records muarl's version and a sha256 of every data file at the start; a resume
    after the file changed under the same path is refused in one line, and the run is left as it was."""
    import hashlib
    import shutil

    from muarl.cli import main

    data = tmp_path / "data.jsonl"
    shutil.copy(sft_data, data)
    out = tmp_path / "run"
    argv = ["sft", "--preset", "tiny", "--data", str(data), "--out", str(out), "--epochs", "1", "--batch-size", "3",
            "--save-every", "1", "--keep-checkpoints", "0", "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "provenance.json").read_text())
    assert record["inputs"]["data"] == {str(data): hashlib.sha256(data.read_bytes()).hexdigest()}
    assert record["muarl"]["version"]
    assert main(argv) == 0  # the same data: resumes (from its last step)
    saved = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    capsys.readouterr()
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:-1]))  # one conversation fewer
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "inputs changed since it started (data." in err, err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()} == saved
    assert json.loads((out / "provenance.json").read_text()) == record


def test_a_grpo_resume_whose_domain_data_changed_is_refused(tmp_path, monkeypatch, capsys):
    """GRPO records its domain's provenance (a bridge's package version and data digest, through the public
    ``Domain.provenance`` hook) and refuses to resume when it changed."""
    import dataclasses

    from muarl import domain as domain_module
    from muarl.cli import main
    from train_fixtures import coin

    release = {"data_sha256": "a" * 64}
    monkeypatch.setitem(domain_module._REGISTRY, "versioned_coin",
                        dataclasses.replace(coin, name="versioned_coin", provenance=lambda: dict(release)))
    out = tmp_path / "run"
    argv = ["grpo", "--preset", "tiny", "--domain", "versioned_coin", "--steps", "1", "--tasks-per-step", "1",
            "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert json.loads((out / "provenance.json").read_text())["inputs"]["domain"] == release
    capsys.readouterr()
    release["data_sha256"] = "b" * 64
    assert main([*argv[:-3], "--steps", "2", *argv[-3:]]) == 2  # more steps: would resume, but the data moved
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "domain.data_sha256: aaaaaaaaaaaa... -> bbbbbbbbbbbb..." in err, err


def test_each_rank_hashes_the_files_it_wrote():
    """A sharded checkpoint's manifest: each rank hashes its own random state and shard files (no rank reads
    the others' shards back), rank 0 the rest; the parts cover every file once."""
    from muarl.train.checkpoint import writer

    files = ["manifest_ignored", "model/model.safetensors", "rng_rank0.pt", "rng_rank1.pt", "rng_rank12.pt",
             "shards/.metadata", "shards/__0_0.distcp", "shards/__1_0.distcp", "shards/__12_3.distcp",
             "state.json", "trainer_state.pt"]
    owners = {rel: writer(rel) for rel in files}
    assert {rel for rel, rank in owners.items() if rank == 1} == {"rng_rank1.pt", "shards/__1_0.distcp"}
    assert {rel for rel, rank in owners.items() if rank == 12} == {"rng_rank12.pt", "shards/__12_3.distcp"}
    assert {rel for rel, rank in owners.items() if rank == 0} == set(files) - {
        "rng_rank1.pt", "shards/__1_0.distcp", "rng_rank12.pt", "shards/__12_3.distcp"}
