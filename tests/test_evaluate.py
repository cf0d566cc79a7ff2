"""muarl eval: pass^k and the other metrics against hand-computed values, result files, resumption after
a SIGKILL of a real `python -m muarl eval`, CLI errors, and a real HF model as the policy."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from muarl.cli import main
from muarl.domain import get_domain
from muarl.evaluate import (
    EvalResult,
    evaluate,
    evaluate_async,
    pass_hat_k,
    result_from_trajectories,
    summarize,
)
from muarl.factory import make_policy, make_user
from muarl.rollout import EpisodeConfig, load_trajectories
from muarl.time_split import without_time
from muarl.types import Reward, ToolRecord, Trajectory, Violation

ROOT = Path(__file__).resolve().parents[1]


def run_muarl(*args: str, **kw) -> subprocess.Popen:
    """A real `python -m muarl` process that imports this checkout's sources."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "muarl", *args], cwd=ROOT, env=env, **kw)


# -- pass^k ----------------------------------------------------------------------------------------------
def test_pass_hat_k_is_taus_combinatorics():
    # 4 trials, 2 successes: pass^1 = 2/4; pass^2 = C(2,2)/C(4,2) = 1/6; c < k gives 0
    assert pass_hat_k(4, 2, 1) == 0.5
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 2, 3) == 0.0 and pass_hat_k(4, 2, 4) == 0.0
    # 5 trials, 4 successes: pass^3 = C(4,3)/C(5,3) = 4/10
    assert pass_hat_k(5, 4, 3) == pytest.approx(0.4)
    assert pass_hat_k(3, 3, 3) == 1.0 and pass_hat_k(3, 0, 1) == 0.0
    assert pass_hat_k(2, 2, 3) is None  # fewer trials than k: undefined, not 0
    for bad in [(2, 3, 1), (2, 1, 0), (-1, 0, 1)]:
        with pytest.raises(ValueError):
            pass_hat_k(*bad)


def traj(task: str, member: int, reward: float, *, turns: int = 4, calls: tuple[str, ...] = (),
         stop: str = "user_stop", violation: bool = False, sim_fault: bool = False, tcr: float | None = None
         ) -> Trajectory:
    log = [ToolRecord(call_id=f"c{i}", name=name) for i, name in enumerate(calls)]
    violations = [Violation(kind="unconfirmed_write", call_id="c0", tool="w", detail="")] if violation else []
    return Trajectory(task_id=task, domain="d", stop_reason=stop, turns=turns, tool_log=log, sim_fault=sim_fault,
                      metadata={"member": member},
                      reward=Reward(reward=reward, db_match=reward == 1.0, outputs_ok=True, outputs_required=True,
                                    tcr=reward if tcr is None else tcr, violations=violations))


def constructed_groups() -> list[list[Trajectory]]:
    a = [traj("A", 0, 1.0, turns=4, calls=("look",)), traj("A", 1, 1.0, turns=6, calls=("look",)),
         traj("A", 2, 0.0, turns=8, calls=("look", "write"), violation=True, tcr=0.5),
         traj("A", 3, 1.0, turns=10, calls=("look",))]
    b = [traj("B", m, 0.0, turns=2) for m in range(3)] + [
        traj("B", 3, 0.0, turns=3, calls=("transfer_to_human_agents",), stop="transfer")]
    # the sim-fault trial's DB happens to match gold (reward 1.0): counted, it must still be a failure
    c = [traj("C", 0, 1.0), traj("C", 1, 1.0, turns=0, stop="sim_fault", sim_fault=True), traj("C", 2, 1.0),
         traj("C", 3, 1.0)]
    return [a, b, c]


def test_metrics_on_constructed_trajectories_excluding_sim_faults():
    metrics, rows, fams = summarize(constructed_groups(), {"A": "f1", "B": "f2", "C": "f1"}, 4)
    # per task: A n=4 c=3 -> 3/4, C(3,2)/C(4,2)=1/2, C(3,3)/C(4,3)=1/4, 0; B all 0; C n=3 c=3 -> 1,1,1,undefined
    a, b, c = rows
    assert (a["trials"], a["successes"], b["successes"], c["trials"], c["successes"]) == (4, 3, 0, 3, 3)
    assert [a[f"pass^{j}"] for j in range(1, 5)] == [0.75, 0.5, 0.25, 0.0]
    assert [c[f"pass^{j}"] for j in range(1, 5)] == [1.0, 1.0, 1.0, None]
    assert metrics["pass^1"] == pytest.approx((0.75 + 0 + 1) / 3, abs=1e-6)
    assert metrics["pass^2"] == pytest.approx((0.5 + 0 + 1) / 3, abs=1e-6)
    assert metrics["pass^3"] == pytest.approx((0.25 + 0 + 1) / 3, abs=1e-6)
    assert metrics["pass^4"] == 0.0 and metrics["pass_tasks"]["pass^4"] == 2  # C has no 4th valid trial
    assert metrics["accuracy"] == pytest.approx(6 / 11, abs=1e-6)  # 11 trials, the fault left out
    assert metrics["tcr"] == pytest.approx((3 + 0.5 + 3) / 11, abs=1e-6)
    assert metrics["avg_turns"] == pytest.approx((4 + 6 + 8 + 10 + 2 * 3 + 3 + 3 * 4) / 11, abs=1e-6)
    assert metrics["tool_calls"] == {"look": pytest.approx(4 / 11, abs=1e-6), "write": pytest.approx(1 / 11, abs=1e-6),
                                     "transfer_to_human_agents": pytest.approx(1 / 11, abs=1e-6)}
    assert metrics["transfer_rate"] == pytest.approx(1 / 11, abs=1e-6)
    assert metrics["violation_rate"] == pytest.approx(1 / 11, abs=1e-6)
    assert metrics["violations"] == {"unconfirmed_write": 1}
    assert metrics["sim_fault_rate"] == pytest.approx(1 / 12, abs=1e-6)
    assert metrics["stop_reasons"] == {"user_stop": 10, "transfer": 1, "sim_fault": 1}
    assert (metrics["episodes"], metrics["trials"], metrics["tasks"]) == (12, 11, 3)
    assert (a["violations"], a["tcr"], b["transfer_rate"], c["sim_faults"]) == (1, 0.875, 0.25, 1)
    assert c["rewards"] == [1.0, None, 1.0, 1.0]
    assert fams["f1"]["tasks"] == 2 and fams["f1"]["pass^1"] == pytest.approx(0.875)
    assert fams["f1"]["accuracy"] == pytest.approx(6 / 7, abs=1e-6)


def test_sim_faults_counted_as_failures_when_asked():
    metrics, rows, _ = summarize(constructed_groups(), {}, 4, sim_faults="fail")
    c = rows[2]
    assert (c["trials"], c["successes"], c["pass^1"], c["pass^4"]) == (4, 3, 0.75, 0.0)
    assert metrics["accuracy"] == 0.5 and metrics["pass^4"] == 0.0 and metrics["pass_tasks"]["pass^4"] == 3
    assert metrics["sim_fault_rate"] == pytest.approx(1 / 12, abs=1e-6)
    with pytest.raises(ValueError, match="sim_faults"):
        summarize(constructed_groups(), {}, 4, sim_faults="ignore")


# -- real evaluations ------------------------------------------------------------------------------------
def test_evaluate_expert_noconfirm_writes_consistent_results(tmp_path):
    """A real evaluation: the files agree with each other and with the trajectories they summarise."""
    domain = get_domain("airline")
    tasks = domain.tasks("test")[:24]
    result = evaluate(domain, make_policy("expert-noconfirm"), make_user("scripted"), tasks, k=3, out_dir=tmp_path,
                      progress=False)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["k"] == 3 and data["config"]["domain"] == "airline" and data["config"]["split"] == "test"
    assert data["config"]["policy"] == "expert-noconfirm"  # not labelled as the safe expert
    assert data["metrics"] == result.metrics and data["tasks"] == result.tasks
    assert [r["task_id"] for r in data["tasks"]] == [t.id for t in tasks]
    found = load_trajectories(tmp_path / "trajectories.jsonl")
    assert set(found) == {(t.id, m) for t in tasks for m in range(3)}
    assert len({found[(tasks[0].id, m)].user_seed for m in range(3)}) == 3  # every trial meets its own user
    rewards = [t.reward.reward for t in found.values()]
    assert data["metrics"]["accuracy"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)
    violated = [bool(t.reward.violations) for t in found.values()]
    assert data["metrics"]["violation_rate"] == pytest.approx(sum(violated) / len(violated), abs=1e-6)
    assert data["metrics"]["violation_rate"] > 0 and data["metrics"]["accuracy"] < 1  # skipping confirmation shows
    # success within the policy: a right database reached by skipping a check is not one
    clean = [t.reward.reward >= 1 and not t.reward.violations for t in found.values()]
    assert data["metrics"]["compliant_success"] == pytest.approx(sum(clean) / len(clean), abs=1e-6)
    assert any(t.reward.reward >= 1 and t.reward.violations for t in found.values())  # so the two differ here
    assert data["metrics"]["compliant_success"] < data["metrics"]["accuracy"]
    for row in data["tasks"]:
        mine = [clean[i] for i, key in enumerate(found) if key[0] == row["task_id"]]
        assert row["compliant_success"] == pytest.approx(sum(mine) / len(mine), abs=1e-6)
    assert data["metrics"]["episodes"] == 72 and sum(data["metrics"]["stop_reasons"].values()) == 72
    rebuilt = result_from_trajectories(tmp_path / "trajectories.jsonl")
    assert rebuilt.metrics == result.metrics and rebuilt.tasks == result.tasks
    loaded = EvalResult.load(tmp_path, trajectories=True)
    assert [len(g) for g in loaded.trajectories] == [3] * 24
    md = (tmp_path / "results.md").read_text()
    assert "| pass^1 | pass^2 | pass^3 |" in md and tasks[5].id in md
    # a rerun plays nothing new and reports the same
    again = evaluate(domain, make_policy("expert-noconfirm"), make_user("scripted"), tasks, k=3, out_dir=tmp_path,
                     progress=False)
    assert again.timing["episodes_run"] == 0 and again.timing["episodes_resumed"] == 72
    assert again.metrics == result.metrics


def test_raising_k_adds_trials_to_an_existing_run(tmp_path):
    domain = get_domain("retail")
    tasks = domain.tasks("test")[:5]
    policy, user = make_policy("expert"), make_user("scripted")
    evaluate(domain, policy, user, tasks, k=2, out_dir=tmp_path, progress=False)
    more = evaluate(domain, policy, user, tasks, k=4, out_dir=tmp_path, progress=False)
    assert more.timing == {**more.timing, "episodes_run": 10, "episodes_resumed": 10}
    assert all(r["trials"] == 4 for r in more.tasks) and "pass^4" in more.metrics


def test_evaluate_async_inside_a_loop_and_sync_refuses_there():
    import asyncio

    domain = get_domain("retail")
    tasks = domain.tasks("test")[:2]

    async def inside():
        with pytest.raises(RuntimeError, match="evaluate_async"):
            evaluate(domain, make_policy("expert"), make_user("scripted"), tasks)
        return await evaluate_async(domain, make_policy("expert"), make_user("scripted"), tasks, k=2, progress=False)

    result = asyncio.run(inside())
    assert result.metrics["episodes"] == 4 and result.metrics["pass^2"] == 1.0


@pytest.mark.slow
def test_killed_eval_resumes_to_identical_results(tmp_path):
    """SIGKILL a real `muarl eval` partway; the rerun finishes it; the results equal an uninterrupted run's."""
    args = ["eval", "--domain", "telecom", "--split", "test", "--policy", "expert-noconfirm", "--user", "scripted",
            "--k", "4", "--quiet"]
    killed = tmp_path / "killed"
    proc = run_muarl(*args, "--out", str(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = killed / "trajectories.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not path.exists() or path.read_text().count("\n") < 30):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = load_trajectories(path)
    assert 30 <= len(before) < 320, "the run was not interrupted partway"
    assert not (killed / "results.json").exists()
    resumed = run_muarl(*args, "--out", str(killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    whole = tmp_path / "whole"
    fresh = run_muarl(*args, "--out", str(whole), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = fresh.communicate(timeout=300)
    assert fresh.returncode == 0, err[-2000:]
    a, b = (json.loads((d / "results.json").read_text()) for d in (killed, whole))
    assert a["timing"]["episodes_resumed"] == len(before) and a["timing"]["episodes_run"] == 320 - len(before)
    assert a["metrics"]["episodes"] == 320
    for key in ("config", "metrics", "families", "tasks"):
        assert a[key] == b[key], key
    assert a["metrics"]["accuracy"] < 1  # a run with failures, so the equality is not trivially all-ones
    after, reference = load_trajectories(path), load_trajectories(whole / "trajectories.jsonl")
    for key, t in before.items():
        assert after[key].model_dump() == t.model_dump()  # finished work was kept, not replayed
    assert {k: without_time(t.model_dump()) for k, t in after.items()} == \
        {k: without_time(t.model_dump()) for k, t in reference.items()}  # the same play, timed apart
    assert (killed / "results.md").read_text() == (whole / "results.md").read_text()


# -- command line ----------------------------------------------------------------------------------------
def test_eval_cli_prints_and_writes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes tables to the terminal
    out = tmp_path / "run"
    code = main(["eval", "--domain", "retail", "--policy", "expert", "--k", "2", "--limit", "3", "--quiet",
                 "--show-tasks", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "pass^2" in printed and "retail-test-0-00002" in printed and "stop reasons: user_stop 6" in printed
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["policy"] == "expert" and data["config"]["user"] == "scripted"
    assert data["metrics"]["episodes"] == 6 and data["metrics"]["pass^2"] == 1.0
    code = main(["eval", "--domain", "retail", "--tasks", "retail-dev-0-00001", "retail-test-0-00004", "--k", "1",
                 "--quiet", "--out", str(tmp_path / "picked")])
    assert code == 0
    data = json.loads((tmp_path / "picked" / "results.json").read_text())
    assert [r["task_id"] for r in data["tasks"]] == ["retail-dev-0-00001", "retail-test-0-00004"]
    assert data["config"]["split"] == "dev+test"


@pytest.mark.parametrize("extra, message", [
    (["--domain", "nowhere"], "unknown domain 'nowhere'"),
    (["--domain", "retail", "--k", "0"], "--k must be at least 1"),
    (["--domain", "retail", "--tasks", "retail-test-9-99999"], "has no task(s) retail-test-9-99999"),
    (["--domain", "retail", "--policy", "gpt"], "unknown policy 'gpt'"),
    (["--domain", "retail", "--user", "llm:nourl"], "not a model directory"),
    (["--domain", "retail", "--user", "llm:http://127.0.0.1:9/v1"], "expected llm:URL#MODEL"),
])
def test_eval_cli_errors_are_clear(tmp_path, capsys, extra, message):
    assert main(["eval", *extra, "--quiet", "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_eval_refuses_to_mix_runs(tmp_path, capsys):
    run = ["eval", "--domain", "retail", "--limit", "2", "--k", "1", "--quiet", "--out", str(tmp_path / "r")]
    assert main(run) == 0
    assert main([*run, "--policy", "expert-noconfirm"]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "policy: 'expert' there, 'expert-noconfirm' now" in err
    assert main(["rollout", "--domain", "retail", "--limit", "1", "--out", str(tmp_path / "roll")]) == 0
    assert main(["eval", "--domain", "retail", "--limit", "1", "--quiet", "--out", str(tmp_path / "roll")]) == 2
    assert "no config.json from an evaluation" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--domain", "retail"])  # --out is required
    with pytest.raises(ValueError, match="no tasks"):
        evaluate(get_domain("retail"), make_policy("expert"), make_user("scripted"), [])


@pytest.mark.slow
def test_eval_with_the_embedded_hf_model(tmp_path):
    """Any backend evaluates: the tiny transformers model, sampled, through the real CLI."""
    out = tmp_path / "tiny"
    proc = run_muarl("eval", "--domain", "retail", "--policy", "hf:tiny", "--k", "2", "--limit", "2",
                     "--max-new-tokens", "16", "--max-turns", "6", "--temperature", "1.0", "--quiet", "--out",
                     str(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["policy"] == "hf:tiny" and data["metrics"]["episodes"] == 4
    trajs = load_trajectories(out / "trajectories.jsonl").values()
    assert all(t.token_ids and sum(t.loss_mask) > 0 for t in trajs)  # really sampled by the model
    assert sum(data["metrics"]["stop_reasons"].values()) == 4 and data["metrics"]["pass^1"] is not None


def test_episode_config_is_recorded(tmp_path):
    domain = get_domain("retail")
    result = evaluate(domain, make_policy("expert"), make_user("scripted"), [domain.task("retail-test-0-00001")], k=1,
                      out_dir=tmp_path, config=EpisodeConfig(max_turns=3), progress=False)
    assert result.config["max_turns"] == 3
    assert result.metrics["stop_reasons"] == {"max_turns": 1} and result.metrics["accuracy"] == 0.0


def test_the_truncation_rate_counts_episodes_cut_off_at_a_limit():
    """Episodes ending at the per-turn token limit, the context limit or the turn limit are truncated (a
    success rate cannot tell them from clean failures); per task, overall, and compared with an interval."""
    from muarl.compare import compare_runs
    from muarl.evaluate import EvalResult

    cut = ("turn_token_limit", "context_limit", "max_turns")
    groups = [[traj("A", m, 0.0, stop=cut[m]) for m in range(3)] + [traj("A", 3, 1.0)],
              [traj("B", m, 0.0, stop="user_stop") for m in range(3)] + [traj("B", 3, 0.0, stop="transfer")]]
    metrics, rows, _ = summarize(groups, {}, 4)
    assert [r["truncation_rate"] for r in rows] == [0.75, 0.0]
    assert metrics["truncation_rate"] == pytest.approx(3 / 8)
    clean = [[traj(g[0].task_id, m, 0.0) for m in range(4)] for g in groups]
    config = {"domain": "d", "split": "test", "k": 4}
    before, after = (EvalResult(config, *summarize(gs, {}, 4)[:2], gs) for gs in (clean, groups))
    found = {m["metric"]: m for m in compare_runs(before, after, samples=200)["metrics"]}
    assert found["truncation_rate"]["diff"] == pytest.approx(3 / 8) and found["truncation_rate"]["high"] > 0
