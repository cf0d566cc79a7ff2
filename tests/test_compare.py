"""muarl compare: the paired and cluster bootstraps against hand-computed cases, real runs of the expert
against the variant that skips confirmations (one pair, and pairs pooled over seeds), and clear errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from muarl.cli import main
from muarl.compare import cluster_bootstrap, compare_pairs, compare_runs, load_run, paired_bootstrap
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


def test_cluster_bootstrap_against_its_exact_distribution():
    """Two tasks, each with its differences under two seeds: task X gained under both (1, 1), task Y under
    neither (0, 0). Resampling the 2 tasks gives a mean of 1 (XX), 0.5 (XY or YX) or 0 (YY) with
    probability 1/4, 1/2, 1/4, so the 10th and 90th percentiles are 0 and 1: the 80% interval is [0, 1].
    Treating the 4 differences as independent pairs gives k/4 with k ~ Binomial(4, 1/2) (P = 1, 4, 6, 4, 1
    sixteenths): the 10th and 90th percentiles are 0.25 and 0.75, an interval half as wide."""
    clusters = [[1.0, 1.0], [0.0, 0.0]]
    assert cluster_bootstrap(clusters, 20_000, seed=5, confidence=0.8) == (0.5, 0.0, 1.0)
    naive = paired_bootstrap([0.0] * 4, [1.0, 1.0, 0.0, 0.0], 20_000, seed=5, confidence=0.8)
    assert naive == (0.5, 0.25, 0.75)
    # unequal clusters: X has 3 differences, Y 1. The estimate is the mean of all 4 (0.75, not the mean of
    # the task means, 0.5); a resample's mean is 6/6, 3/4 or 0/2 with probability 1/4, 1/2, 1/4, so the
    # 30th to 70th percentiles are both 0.75
    assert cluster_bootstrap([[1.0, 1.0, 1.0], [0.0]], 20_000, seed=5, confidence=0.4) == (0.75, 0.75, 0.75)
    assert cluster_bootstrap([[1.0, 1.0, 1.0], [0.0]], 20_000, seed=5)[1:] == (0.0, 1.0)
    # seeded: the same seed gives the same interval
    spread = [[0.0, 1.0], [1.0], [0.0, 0.0, 1.0], [1.0, 1.0], [0.0]]
    assert cluster_bootstrap(spread, 500, seed=9) == cluster_bootstrap(spread, 500, seed=9)
    with pytest.raises(ValueError, match="no empty one"):
        cluster_bootstrap([[1.0], []])


def test_the_cluster_interval_is_wider_than_the_naive_one_when_a_tasks_seeds_agree():
    """40 tasks x 3 seeds in which every seed agrees on a task (RL helped it, hurt it or left it): the 120
    differences carry the information of 40, so the cluster interval is about sqrt(3) times the naive one."""
    per_task = [1.0] * 14 + [0.0] * 20 + [-1.0] * 6
    clusters = [[d] * 3 for d in per_task]
    mean, low, high = cluster_bootstrap(clusters, 10_000, seed=1)
    flat = [d for c in clusters for d in c]
    n_mean, n_low, n_high = paired_bootstrap([0.0] * len(flat), flat, 10_000, seed=1)
    assert mean == n_mean == pytest.approx(8 / 40)
    # one seed's 40 tasks alone have the same spread as the three seeds pooled by task
    one = paired_bootstrap([0.0] * 40, per_task, 10_000, seed=1)
    assert (high - low) == pytest.approx(one[2] - one[1], rel=0.1)
    assert (high - low) > 1.5 * (n_high - n_low)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real evaluations on airline test: the expert twice (same settings) and the no-confirmation variant."""
    root = tmp_path_factory.mktemp("runs")
    domain = get_domain("airline")
    tasks = domain.tasks("test")
    user = make_user("scripted")
    for name, spec, seed in [("expert", "expert", 0), ("expert2", "expert", 0), ("noconfirm", "expert-noconfirm", 0),
                             ("expert-s1", "expert", 1), ("noconfirm-s1", "expert-noconfirm", 1)]:
        evaluate(domain, make_policy(spec), user, tasks, k=2, out_dir=root / name, progress=False, seed=seed,
                 meta={"policy": spec})
    return root


def test_pairs_pool_by_task_and_the_same_pair_twice_adds_nothing(runs):
    """The same pair of runs given twice is no new evidence: pooled by task, its interval is the one pair's,
    draw for draw; counted as 160 independent pairs it would narrow."""
    worse, better = load_run(runs / "noconfirm"), load_run(runs / "expert")
    one = compare_runs(worse, better, ["pass^1", "policy_fault_rate"], samples=4000)["metrics"][0]
    twice = compare_pairs([(worse, better), (worse, better)], ["pass^1"], samples=4000)
    assert (twice["pairs"], twice["shared_tasks"], twice["task_pairs"]) == (2, 80, 160)
    pooled = twice["metrics"][0]
    assert (pooled["diff"], pooled["low"], pooled["high"]) == (one["diff"], one["low"], one["high"])
    assert (pooled["tasks"], pooled["pairs"], one["tasks"], one["pairs"]) == (80, 160, 80, 80)
    a = [r["pass^1"] for r in worse.tasks] * 2
    b = [{r["task_id"]: r for r in better.tasks}[r["task_id"]]["pass^1"] for r in worse.tasks] * 2
    _, low, high = paired_bootstrap(a, b, 4000)
    assert high - low < pooled["high"] - pooled["low"]
    # two seeds: the estimate is the mean over both seeds' task differences, the clusters are the tasks
    second = (load_run(runs / "noconfirm-s1"), load_run(runs / "expert-s1"))
    report = compare_pairs([(worse, better), second], ["pass^1"], samples=4000, seed=3)
    clusters = {}
    for run_a, run_b in [(worse, better), second]:
        rows_b = {r["task_id"]: r for r in run_b.tasks}
        for r in run_a.tasks:
            clusters.setdefault(r["task_id"], []).append(rows_b[r["task_id"]]["pass^1"] - r["pass^1"])
    mean, low, high = cluster_bootstrap(list(clusters.values()), 4000, seed=3)
    got = report["metrics"][0]
    assert (got["diff"], got["low"], got["high"]) == (round(mean, 6), round(low, 6), round(high, 6))
    # provenance is compared within each pair: there the runs differ in the policy only
    assert [[w.split(":")[0] for w in p["warnings"]] for p in report["provenance"]] == [["policy.name", "policy.spec"]] * 2


def test_compare_cli_pools_several_pairs(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    argv = ["compare", str(runs / "noconfirm"), str(runs / "expert"), str(runs / "noconfirm-s1"),
            str(runs / "expert-s1"), "--samples", "1000"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 2 and report["task_pairs"] == 160 and len(report["run_pairs"]) == 2
    assert report == {**report, **compare_pairs([(load_run(runs / "noconfirm"), load_run(runs / "expert")),
                                                 (load_run(runs / "noconfirm-s1"), load_run(runs / "expert-s1"))],
                                                samples=1000)}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pooled over 2 pairs of runs" in out and "80 tasks (160 task pairs)" in out and "task pairs" in out
    assert main(argv[:4]) == 2
    assert "compare takes runs in pairs, RUN_A RUN_B [RUN_A2 RUN_B2 ...] (got 3 runs)" in capsys.readouterr().err


def test_demo_seeds_pools_seeds_by_task(runs, tmp_path):
    """scripts/demo_seeds.py over two demo run directories (their evaluations: real runs of the two policies
    under seeds 0 and 1): the pooled interval is the cluster bootstrap over tasks, as muarl compare's."""
    for seed, suffix in ((0, ""), (1, "-s1")):
        demo = tmp_path / f"demo-s{seed}"
        for stage, run in (("eval-sft", "noconfirm"), ("eval-rl", "expert")):
            shutil.copytree(runs / f"{run}{suffix}", demo / stage)
            if seed == 0:  # greedy evaluations in one of the two runs only
                shutil.copytree(runs / f"{run}{suffix}", demo / f"{stage}-greedy")
        (demo / "summary.json").write_text(json.dumps({"seed": seed, "total_seconds": 600}))
        (demo / "demo.json").write_text(json.dumps({"temperature": 1.0}))
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "scripts" / "demo_seeds.py"), str(tmp_path / "demo-s0"),
                           str(tmp_path / "demo-s1"), "--samples", "2000"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "src")}, timeout=300)
    assert done.returncode == 0, done.stderr
    pairs = [(load_run(runs / f"noconfirm{s}"), load_run(runs / f"expert{s}")) for s in ("", "-s1")]
    want = {m["metric"]: m for m in compare_pairs(pairs, ["pass^1"], samples=2000)["metrics"]}["pass^1"]
    line = next(x for x in done.stdout.splitlines() if x.startswith("pooled sampled (T = 1) pass^1:"))
    assert (f"change {want['diff']:+.3f}, 95% interval [{want['low']:+.3f}, {want['high']:+.3f}] over 80 tasks x 2 "
            "seeds (160 task pairs; cluster bootstrap over tasks)") in line, line
    rows = [x for x in done.stdout.splitlines() if x.startswith("| 0 |") or x.startswith("| 1 |")]
    assert "0.000/0.000/0.000 -> 0.000/0.000/0.000" in rows[0]  # the fault rates beside pass^1
    assert rows[0].split(" | ")[5] == f"{pairs[0][0].metrics['pass^1']:.3f} -> {pairs[0][1].metrics['pass^1']:.3f}"
    assert rows[1].split(" | ")[5] == "-"  # no greedy evaluations in that run
    before, after = (run.metrics["truncation_rate"] for run in pairs[0])  # issue 45: beside pass^1
    assert rows[0].split(" | ")[7] == f"{before:.3f} -> {after:.3f}"
    assert "pooled sampled (T = 1) truncation_rate:" in done.stdout
    assert "pooled greedy (T = 0, 1 of 2 seeds) pass^1" in done.stdout


def test_identical_runs_differ_by_zero_with_a_zero_interval(runs):
    report = compare_runs(load_run(runs / "expert"), load_run(runs / "expert2"))
    assert report["shared_tasks"] == 80 and report["only_a"] == report["only_b"] == 0
    assert [m["metric"] for m in report["metrics"]] == ["pass^1", "pass^2", "policy_fault_rate", "user_fault_rate",
                                                        "tool_fault_rate", "truncation_rate", "accuracy", "tcr",
                                                        "avg_turns",
                                                        "violation_rate", "compliant_success", "transfer_rate",
                                                        "user_slip_rate"]
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
