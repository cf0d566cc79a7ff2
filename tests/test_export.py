"""``muarl export`` of an unsharded run's checkpoint and of one-rank sharded ones (full and LoRA), each a
Hugging Face checkpoint at ``--out`` itself that ``muarl eval --policy hf:DIR`` plays, and what it refuses
(the export of two ranks' shards is tested with the runs of tests/test_fsdp.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import run_muarl
from muarl.cli import main

ROOT = Path(__file__).resolve().parents[1]
GRPO = ["grpo", "--model", "tiny", "--domain", "retail-lite", "--steps", "1", "--tasks-per-step", "1",
        "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--report-to", "none", "--no-progress"]
EVAL = ["eval", "--domain", "retail-lite", "--k", "1", "--limit", "1", "--max-new-tokens", "8", "--max-turns", "2",
        "--quiet"]


def test_an_unsharded_checkpoint_exports_as_the_run_wrote_it_and_bad_paths_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*GRPO, "--out", "runs/g"]) == 0
    (tmp_path / "exported").mkdir()  # an empty directory is written into
    assert main(["export", "runs/g", "--out", "exported"]) == 0  # a run directory: its newest checkpoint
    ours = load_file("exported/model.safetensors")  # the checkpoint at --out itself, not in a folder of it
    run = load_file("runs/g/model/model.safetensors")
    assert ours.keys() == run.keys() and all((ours[k] == run[k]).all() for k in run)
    capsys.readouterr()

    for args, says in ((["runs/g/model"], "is not a checkpoint of a muarl run"),
                       (["runs/g", "--out", "exported"], "is not an empty directory"),
                       (["runs/g/checkpoints/step_1", "--out", "runs/g/checkpoints/step_1/x"],
                        "inside the checkpoint being exported")):
        argv = ["export", *args] if "--out" in args else ["export", *args, "--out", "elsewhere"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    weights = next((tmp_path / "runs/g/checkpoints/step_1").rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # damaged: refused, naming it
    assert main(["export", "runs/g/checkpoints/step_1", "--out", "fresh"]) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and err.count("\n") == 1, err
    assert not (tmp_path / "fresh").exists()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_a_sharded_checkpoint_exports_to_a_directory_that_muarl_eval_plays_as_hf(tmp_path, monkeypatch, lora):
    """A sharded run (``--fsdp`` on one process: its checkpoints hold DCP shards only, which ``hf:`` cannot
    read) exported to DIR: DIR is the Hugging Face checkpoint, weights equal to the run's own result (LoRA:
    the merge at DIR, the adapter in DIR/adapter equal to the run's), and ``muarl eval --policy hf:DIR``
    plays an episode on it."""
    monkeypatch.chdir(tmp_path)
    extra = ["--lora-r", str(lora)] if lora else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = run_muarl(*GRPO, "--fsdp", "--save-every", "1", "--out", "runs/s", *extra, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    step = tmp_path / "runs/s/checkpoints/step_1"
    assert (step / "shards").is_dir() and not list(step.glob("**/*.safetensors"))  # shards only
    assert main(["export", str(step), "--out", "exported"]) == 0
    exported = tmp_path / "exported"
    assert json.loads((exported / "config.json").read_text())["model_type"]
    assert not (exported / "model").exists()
    ours, run = load_file(exported / "model.safetensors"), load_file("runs/s/model/model.safetensors")
    assert ours.keys() == run.keys() and all((ours[k] == run[k]).all() for k in run)
    if lora:
        ours = load_file(exported / "adapter" / "adapter_model.safetensors")
        run = load_file("runs/s/adapter/adapter_model.safetensors")
        assert ours.keys() == run.keys() and all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in run)
        assert all((ours[k] == run[k]).all() for k in run)
    assert main([*EVAL, "--policy", "hf:exported", "--out", "ev"]) == 0
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["metrics"]["episodes"] == 1 and results["config"]["policy"] == "hf:exported"
