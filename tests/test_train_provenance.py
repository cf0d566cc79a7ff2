"""Issue 34 item 8: ``muarl sft`` and ``muarl grpo`` record what produced them, and a resume whose data,
domain or model differs from that record is refused in one line naming the field.

Real runs of the commands (the shipped tiny base, two SFT steps; one GRPO step on the coin domain of
tests/train_fixtures.py), rerun the way a user resumes: the same command, with one input changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import muarl
from muarl import domain as domain_module
from muarl.cli import main
from muarl.models import base_path
from muarl.provenance import muarl_commit, package_version
from train_fixtures import coin, write_sft_data


def _checkpoints(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a command that must be refused: exit 2 and one line on stderr, which is returned."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("muarl: error: "), err
    return err


def test_sft_records_its_provenance_and_refuses_a_resume_on_other_data_or_model(tmp_path, capsys):
    data, other = tmp_path / "data.jsonl", tmp_path / "other.jsonl"
    write_sft_data(data)
    other.write_text("".join(data.read_text().splitlines(keepends=True)[:4]))
    model = tmp_path / "model"  # a copy of the shipped base, so that it can change under the same path
    shutil.copytree(base_path(), model)
    out = tmp_path / "run"
    argv = ["sft", "--preset", "tiny", "--model", str(model), "--data", str(data), "--out", str(out), "--epochs", "1",
            "--batch-size", "3", "--save-every", "1", "--keep-checkpoints", "0", "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "provenance.json").read_text())
    assert record["muarl"] == {"version": muarl.__version__, "commit": muarl_commit()}
    assert record["packages"]["torch"] == package_version("torch")["version"] and record["packages"]["transformers"]
    assert record["specs"] == {"model": str(model), "data": [str(data)]}
    assert record["model"] == {"spec": str(model), "path": str(model), "adapters": []}
    assert record["inputs"]["data"] == {str(data): hashlib.sha256(data.read_bytes()).hexdigest()}
    weights = (model / "model.safetensors").read_bytes()
    assert record["inputs"]["model"]["model.safetensors"] == hashlib.sha256(weights).hexdigest()
    assert set(record["inputs"]["model"]) >= {"config.json", "tokenizer.json", "model.safetensors"}
    saved = _checkpoints(out)

    # other data: refused, naming the field, checkpoints and record untouched
    err = _refused([*argv[:6], str(other), *argv[7:]], capsys)
    assert "another config (data: [" in err and str(other) in err, err
    # the same model path with other weights (a retrained model): refused, naming the file
    tensors = load_file(model / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    err = _refused(argv, capsys)
    assert "inputs changed since it started (model.model.safetensors: " in err, err
    assert _checkpoints(out) == saved and json.loads((out / "provenance.json").read_text()) == record

    (model / "model.safetensors").write_bytes(weights)  # restored: the same command resumes
    assert main(argv) == 0
    # a run recorded before the model's digests were kept resumes (nothing to compare), and other package
    # versions are a warning, not a refusal
    older = {**record, "inputs": {"data": record["inputs"]["data"]},
             "packages": {**record["packages"], "torch": "0.0.1"}}
    (out / "provenance.json").write_text(json.dumps(older))
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "muarl: warning: " in err and f"packages.torch: 0.0.1 -> {torch.__version__}" in err, err


def test_grpo_records_its_specs_and_refuses_a_resume_on_another_domain_or_model(tmp_path, monkeypatch, capsys):
    for name in ("coin_a", "coin_b"):
        monkeypatch.setitem(domain_module._REGISTRY, name, dataclasses.replace(coin, name=name))
    out = tmp_path / "run"
    argv = ["grpo", "--preset", "tiny", "--domain", "coin_a", "--steps", "1", "--tasks-per-step", "1",
            "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "provenance.json").read_text())
    assert record["specs"] == {"model": "tiny", "domain": "coin_a", "user": "scripted", "split": "train",
                               "rollout_engine": "hf"}
    assert record["model"]["path"] == str(base_path()) and record["inputs"]["domain"].keys() == {"tasks", "source"}
    assert record["inputs"]["model"]["model.safetensors"] == hashlib.sha256(
        (base_path() / "model.safetensors").read_bytes()).hexdigest()
    err = _refused([*argv[:4], "coin_b", *argv[5:]], capsys)
    assert "another config (domain: 'coin_a' -> 'coin_b')" in err, err
    err = _refused([*argv, "--model", "tiny-random"], capsys)
    assert "another config (model: 'tiny' -> 'tiny-random')" in err, err


def test_a_resume_after_the_domains_tasks_changed_is_refused(tmp_path, monkeypatch, capsys):
    """A domain without a provenance hook (the built-in ones, a plug-in) records digests of its task set and
    its tools' source; a muarl version whose tasks changed must not resume a run started on the old ones.
    The new version is stood in for by a registry entry of the same name with one task reworded (editing
    muarl's own task generator is what a real upgrade does, which a test cannot). A record written before
    these digests (``domain: {}``) resumes."""
    monkeypatch.setitem(domain_module._REGISTRY, "coin_v", dataclasses.replace(coin, name="coin_v"))
    out = tmp_path / "run"
    argv = ["grpo", "--preset", "tiny", "--domain", "coin_v", "--tasks-per-step", "1", "--group-size", "2",
            "--max-new-tokens", "8", "--max-turns", "2", "--out", str(out), "--no-progress", "--save-every", "1"]
    assert main([*argv, "--steps", "1"]) == 0
    reworded = dataclasses.replace(coin, name="coin_v")
    tasks = reworded.tasks()
    reworded._tasks = [tasks[0].model_copy(update={"instruction": tasks[0].instruction + " Please hurry."}),
                       *tasks[1:]]
    monkeypatch.setitem(domain_module._REGISTRY, "coin_v", reworded)
    err = _refused([*argv, "--steps", "2"], capsys)
    assert "inputs changed since it started (domain.tasks:" in err and "source" not in err, err
    record = json.loads((out / "provenance.json").read_text())
    record["inputs"]["domain"] = {}  # as muarl recorded a built-in domain before
    (out / "provenance.json").write_text(json.dumps(record))
    assert main([*argv, "--steps", "2"]) == 0


def test_a_resume_compares_the_device_by_its_kind(tmp_path, monkeypatch, capsys):
    """A run resumes on another device of the same kind (``cuda:0`` -> ``cuda:1``, or ``cpu`` named or left to
    the machine), never across kinds (a run recorded on a GPU is refused on the CPU: its numbers differ)."""
    monkeypatch.setitem(domain_module._REGISTRY, "coin_a", dataclasses.replace(coin, name="coin_a"))
    out = tmp_path / "run"
    argv = ["grpo", "--preset", "tiny", "--domain", "coin_a", "--steps", "1", "--tasks-per-step", "1",
            "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--save-every", "1",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["device"] is None
    other = "cpu" if torch.cuda.is_available() else "cuda:1"  # the kind this machine would not pick
    (out / "config.json").write_text(json.dumps({**config, "device": other}))
    err = _refused([*argv, "--resume"], capsys)
    assert f"another config (device: '{other}' -> None)" in err, err
    (out / "config.json").write_text(json.dumps({**config, "device": "cpu:0"}))
    assert main([*argv[:6], "2", *argv[7:], "--resume", "--device", "cpu"]) == 0
    assert json.loads((out / "config.json").read_text())["device"] == "cpu"
