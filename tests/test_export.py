"""``muarl export`` of an unsharded run's checkpoint, and what it refuses (the sharded export is tested
with the two-rank runs of tests/test_fsdp.py)."""

from __future__ import annotations

from safetensors.torch import load_file

from muarl.cli import main


def test_an_unsharded_checkpoint_exports_as_the_run_wrote_it_and_bad_paths_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["grpo", "--model", "tiny", "--domain", "retail-lite", "--steps", "1", "--tasks-per-step", "1",
                 "--group-size", "2", "--max-new-tokens", "8", "--max-turns", "2", "--report-to", "none",
                 "--out", "runs/g", "--no-progress"]) == 0
    assert main(["export", "runs/g", "--out", "exported"]) == 0  # a run directory: its newest checkpoint
    ours = load_file("exported/model/model.safetensors")
    run = load_file("runs/g/model/model.safetensors")
    assert ours.keys() == run.keys() and all((ours[k] == run[k]).all() for k in run)
    capsys.readouterr()

    for args, says in ((["runs/g/model"], "is not a checkpoint of a muarl run"),
                       (["runs/g", "--out", "exported"], "already holds an exported model"),
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
