"""muarl compare: the paired bootstrap against hand-computed cases, real runs of the expert against the
variant that skips confirmations, and clear errors."""

import json
import shutil

import pytest

from muarl.cli import main
from muarl.compare import compare_runs, load_run, paired_bootstrap
from muarl.domain import get_domain
from muarl.evaluate import evaluate
from muarl.factory import make_policy, make_user


def test_bootstrap_of_a_constant_difference_is_that_constant():
    mean, low, high = paired_bootstrap([0.0, 0.5, 1.0, 0.25], [0.5, 1.0, 1.5, 0.75], samples=500)
    assert (mean, low, high) == (0.5, 0.5, 0.5)


def test_bootstrap_percentiles_match_the_exact_resampling_distribution():
    # two tasks with differences 0 and 1: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4,
    # so the 2.5th and 97.5th percentiles are 0 and 1 and the middle 40% interval is [0.5, 0.5]
    mean, low, high = paired_bootstrap([0, 0], [0, 1], samples=20_000, seed=3)
    assert (mean, low, high) == (0.5, 0.0, 1.0)
    assert paired_bootstrap([0, 0], [0, 1], samples=20_000, seed=3, confidence=0.4)[1:] == (0.5, 0.5)
    # the interval is seeded: the same seed gives the same interval
    a, b = [0, 1, 1, 0, 1, 0, 0, 1], [1, 1, 1, 0, 1, 1, 0, 1]
    assert paired_bootstrap(a, b, 2000, seed=7) == paired_bootstrap(a, b, 2000, seed=7)
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real evaluations on airline test: the expert twice (same settings) and the no-confirmation variant."""
    root = tmp_path_factory.mktemp("runs")
    domain = get_domain("airline")
    tasks = domain.tasks("test")
    user = make_user("scripted")
    for name, spec in [("expert", "expert"), ("expert2", "expert"), ("noconfirm", "expert-noconfirm")]:
        evaluate(domain, make_policy(spec), user, tasks, k=2, out_dir=root / name, progress=False,
                 meta={"policy": spec})
    return root


def test_identical_runs_differ_by_zero_with_a_zero_interval(runs):
    report = compare_runs(load_run(runs / "expert"), load_run(runs / "expert2"))
    assert report["shared_tasks"] == 80 and report["only_a"] == report["only_b"] == 0
    assert [m["metric"] for m in report["metrics"]] == ["pass^1", "pass^2", "accuracy", "tcr", "avg_turns",
                                                        "violation_rate", "transfer_rate"]
    for m in report["metrics"]:
        assert (m["diff"], m["low"], m["high"], m["excludes_zero"]) == (0.0, 0.0, 0.0, False)


def test_a_clearly_better_run_has_an_interval_excluding_zero(runs):
    worse, better = load_run(runs / "noconfirm"), load_run(runs / "expert")
    report = compare_runs(worse, better, ["pass^1", "violation_rate", "avg_turns"], samples=4000)
    by = {m["metric"]: m for m in report["metrics"]}
    # the point estimate is the difference of the runs' own per-task means
    assert by["pass^1"]["diff"] == pytest.approx(better.metrics["pass^1"] - worse.metrics["pass^1"], abs=1e-6)
    assert by["pass^1"]["diff"] > 0 and by["pass^1"]["excludes_zero"] and by["pass^1"]["low"] > 0
    assert by["pass^1"]["low"] <= by["pass^1"]["diff"] <= by["pass^1"]["high"]
    assert by["violation_rate"]["high"] < 0 and by["violation_rate"]["excludes_zero"]
    # and the other way round, the signs flip
    back = {m["metric"]: m for m in compare_runs(better, worse, ["pass^1"], samples=4000)["metrics"]}
    assert back["pass^1"]["diff"] == -by["pass^1"]["diff"] and back["pass^1"]["high"] < 0


def test_only_shared_tasks_are_paired_and_unfinished_runs_compare(runs, tmp_path):
    domain = get_domain("airline")
    few = tmp_path / "few"
    evaluate(domain, make_policy("expert"), make_user("scripted"), domain.tasks("test")[:10], k=2, out_dir=few,
             progress=False)
    report = compare_runs(load_run(runs / "noconfirm"), load_run(few))
    assert (report["shared_tasks"], report["only_a"], report["only_b"]) == (10, 70, 0)
    # a run killed before writing results.json is compared from its trajectories alone
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(runs / "noconfirm" / "trajectories.jsonl", partial / "trajectories.jsonl")
    from_trajs = compare_runs(load_run(partial), load_run(runs / "expert"), samples=1000)
    from_results = compare_runs(load_run(runs / "noconfirm"), load_run(runs / "expert"), samples=1000)
    assert from_trajs["metrics"] == from_results["metrics"]


def test_compare_cli_table_and_json(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["compare", str(runs / "noconfirm"), str(runs / "expert"), "--samples", "2000"]) == 0
    out = capsys.readouterr().out
    assert "80 shared tasks" in out and "pass^1" in out
    assert "differences whose interval excludes 0: pass^1" in out
    assert main(["compare", str(runs / "noconfirm"), str(runs / "expert"), "--json", "--metrics", "tcr",
                 "--samples", "500", "--seed", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [m["metric"] for m in report["metrics"]] == ["tcr"] and report["samples"] == 500
    assert report["run_a"].endswith("noconfirm")


def test_compare_cli_errors(runs, tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(runs / "expert")]) == 2
    assert "no such run" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), str(runs / "expert")]) == 2
    assert "neither results.json nor trajectories.jsonl" in capsys.readouterr().err
    assert main(["compare", str(runs / "expert"), str(runs / "expert"), "--metrics", "pass^9"]) == 2
    assert "unknown metric(s) pass^9" in capsys.readouterr().err
    assert main(["compare", str(runs / "expert"), str(runs / "expert"), "--samples", "0"]) == 2
    assert "--samples must be at least 1" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["compare", str(tmp_path / "bad.json"), str(runs / "expert")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    retail, dev = tmp_path / "retail", tmp_path / "dev"
    assert main(["eval", "--domain", "retail", "--limit", "2", "--k", "1", "--quiet", "--out", str(retail)]) == 0
    assert main(["eval", "--domain", "airline", "--split", "dev", "--limit", "2", "--k", "1", "--quiet",
                 "--out", str(dev)]) == 0
    capsys.readouterr()
    assert main(["compare", str(retail), str(runs / "expert")]) == 2
    assert "different domains (retail vs airline)" in capsys.readouterr().err
    assert main(["compare", str(dev), str(runs / "expert")]) == 2
    assert "share no task" in capsys.readouterr().err
