"""Issue 34 item 4: a policy fault is the policy failing, a user or tool fault is nobody's result.

The parties are real: the expert policy on retail, which breaks on chosen tasks the three ways a policy
can (it raises, returns something that is not a turn, runs past ``--agent-timeout``); the scripted user,
which cannot start on a chosen task; the counter-desk plug-in's teacher, which raises on half of the tasks
(the issue's custom domain whose pass^1 read 1.000 while half its episodes faulted). Every number below
is derived by hand from which tasks break.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from muarl.cli import main
from muarl.compare import compare_runs, load_run
from muarl.domain import Domain, get_domain
from muarl.evaluate import FAULT_COLUMNS, evaluate
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import EpisodeConfig
from muarl.train.groups import rollout_metrics
from muarl.types import Message, Task
from muarl.users.base import UserSession
from muarl.users.scripted import ScriptedUser

TESTS = Path(__file__).parent


class BreaksOn(Policy):
    """The expert, except on the tasks in ``how`` (task id -> raise | garbage | hang), where its turn breaks."""

    name = "breaks-on"

    def __init__(self, how: dict[str, str]):
        self.how, self.expert = how, ExpertPolicy()

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> PolicySession:
        inner = self.expert.session(domain, task, seed)
        return _Breaking(inner, self.how[task.id]) if task.id in self.how else inner


class _Breaking(PolicySession):
    def __init__(self, inner: PolicySession, how: str):
        self.inner, self.how = inner, how

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        if self.how == "raise":
            raise ConnectionError("the policy backend went away")
        if self.how == "garbage":
            return "<|im_end|>"  # type: ignore[return-value]  (not an AgentTurn)
        await asyncio.Event().wait()  # hang: past --agent-timeout
        raise AssertionError("unreachable")


class CannotStartOn(ScriptedUser):
    """The scripted user, except that it cannot start a conversation on the tasks in ``broken``."""

    name = "cannot-start-on"

    def __init__(self, broken: set[str]):
        super().__init__()
        self.broken = broken

    def session(self, task: Task, seed: int) -> UserSession:
        if task.id in self.broken:
            raise RuntimeError(f"the simulator has no persona for {task.id}")
        return super().session(task, seed)


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory):
    """Six retail test tasks, two trials each: the policy breaks on tasks 0-2 (raise, garbage, hang), the
    user cannot start task 3, tasks 4 and 5 are clean (the expert wins them)."""
    retail = get_domain("retail")
    tasks = retail.tasks("test")[:6]
    policy = BreaksOn({tasks[0].id: "raise", tasks[1].id: "garbage", tasks[2].id: "hang"})
    user = CannotStartOn({tasks[3].id})
    out = tmp_path_factory.mktemp("broken")
    result = evaluate(retail, policy, user, tasks, k=2, out_dir=out, config=EpisodeConfig(agent_timeout=0.5),
                      progress=False, meta={"policy": "breaks-on"})
    return tasks, result, out


def test_policy_faults_are_failures_and_user_faults_stay_out(broken_run) -> None:
    tasks, result, _ = broken_run
    m = result.metrics
    kinds = [[t.fault_kind for t in g] for g in result.trajectories]
    assert kinds == [["policy"] * 2, ["policy"] * 2, ["policy_timeout"] * 2, ["user"] * 2, [None] * 2, [None] * 2]
    # tasks 0-2 fail (0), task 3 has no trial, tasks 4-5 succeed: pass^1 = 2/5, not 2/2 as when faults were dropped
    assert m["pass^1"] == pytest.approx(2 / 5) and m["pass_tasks"]["pass^1"] == 5
    assert m["pass^2"] == pytest.approx(2 / 5)
    assert (m["trials"], m["episodes"]) == (10, 12) and m["accuracy"] == pytest.approx(4 / 10)
    assert m["tcr"] == pytest.approx(4 / 10) and m["db_match_rate"] == pytest.approx(4 / 10)
    # the rates by party, over every episode
    assert (m["policy_fault_rate"], m["user_fault_rate"], m["tool_fault_rate"]) == (0.5, pytest.approx(1 / 6, abs=1e-6), 0.0)
    rows = {r["task_id"]: r for r in result.tasks}
    assert [rows[t.id]["pass^1"] for t in tasks] == [0.0, 0.0, 0.0, None, 1.0, 1.0]
    assert rows[tasks[0].id]["policy_fault_rate"] == 1.0 and rows[tasks[3].id]["user_fault_rate"] == 1.0
    assert rows[tasks[0].id]["rewards"] == [0.0, 0.0] and rows[tasks[3].id]["rewards"] == [None, None]
    # --sim-faults fail counts the user's faults too: 2 of 6 tasks
    from muarl.evaluate import summarize

    counted, _, _ = summarize(result.trajectories, {}, 2, sim_faults="fail")
    assert counted["pass^1"] == pytest.approx(2 / 6) and counted["trials"] == 12


def test_grpo_step_metrics_count_faults_as_evaluation_does(broken_run) -> None:
    """A GRPO step's logged reward: policy faults are 0, the user's faulted episodes are left out."""
    _, result, _ = broken_run
    metrics = rollout_metrics(result.trajectories)
    assert metrics["reward"] == pytest.approx(4 / 10) and metrics["fault_rate"] == pytest.approx(8 / 12)
    # groups: three all-wrong (policy faults), one with no counted episode (neither), two all-correct
    assert metrics["all_wrong_groups"] == pytest.approx(3 / 6) and metrics["all_correct_groups"] == pytest.approx(2 / 6)


def test_results_tables_show_the_fault_rates_by_party_beside_pass1(broken_run, capsys, monkeypatch) -> None:
    _, result, out = broken_run
    monkeypatch.setenv("COLUMNS", "200")
    md = (out / "results.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| pass^1"))
    assert head.startswith("| pass^1 | pass^2 | policy fault rate | user fault rate | tool fault rate | truncation rate "
                           "| accuracy"), head
    values = md.splitlines()[md.splitlines().index(head) + 2]
    truncated = f"{result.metrics['truncation_rate']:.3f}"
    assert values.startswith(f"| 0.400 | 0.400 | 0.500 | 0.167 | 0.000 | {truncated} | 0.400 |"), values
    assert "| policy_timeout | 2 | as failures |" in md and "| user | 2 | left out |" in md
    assert "## Faults (policy faults counted as failures, the others left out)" in md
    # muarl view's overview: the same success, the rates right after it
    from muarl.report import data as rd

    overview = rd.overview(rd.load_run(out))
    keys = list(overview)
    assert overview["success"] == 0.4 and overview["policy_fault_rate"] == 0.5
    assert keys[keys.index("success") + 1:keys.index("success") + 4] == list(FAULT_COLUMNS)
    # muarl compare: the fault rates are rows right after pass^k, with their own intervals
    report = compare_runs(load_run(out), load_run(out), samples=200)
    assert [d["metric"] for d in report["metrics"]][:5] == ["pass^1", "pass^2", "policy_fault_rate",
                                                            "user_fault_rate", "tool_fault_rate"]
    assert main(["compare", str(out), str(out), "--samples", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if "pass^2" in line)
    assert "policy fault rate" in lines[at + 1] and "0.500" in lines[at + 1]


def test_eval_cli_counts_a_teacher_that_cannot_play_half_the_tasks_as_failing_them(tmp_path, capsys,
                                                                                     monkeypatch) -> None:
    """The issue's case: a policy that raises on the ``bump`` half of a custom domain's tasks read pass^1
    1.000; it is 0.500 (it wins the other half), with the policy fault rate beside it in the table."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["eval", "--domain", "counter_plugin:domain", "--policy", "counter_plugin:CannotPlayTeacher",
                 "--user", "counter_plugin:CounterUser", "--k", "1", "--quiet", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert metrics["pass^1"] == 0.5 and metrics["policy_fault_rate"] == 0.5 and metrics["faults"] == {"policy": 2}
    rows = [line for line in out.splitlines() if "│" in line]
    at = next(i for i, line in enumerate(rows) if "pass^1" in line)
    assert "0.500" in rows[at] and "policy fault rate" in rows[at + 1] and "0.500" in rows[at + 1]
    # the rollout command's summary agrees
    code = main(["rollout", "--domain", "counter_plugin:domain", "--policy", "counter_plugin:CannotPlayTeacher",
                 "--user", "counter_plugin:CounterUser", "--n", "1", "--out", str(tmp_path / "rollout")])
    summary = json.loads((tmp_path / "rollout" / "summary.json").read_text())
    assert code == 0 and summary["success"] == 0.5 and summary["policy_fault_rate"] == 0.5


def test_a_tool_fault_stays_out_of_the_metrics(tmp_path, monkeypatch) -> None:
    """A tool that raises (here the real retail tool, made to raise by a bug injected for this test: a tool
    server's failure cannot be produced otherwise without a server) is not the policy's doing."""
    retail = get_domain("retail")
    tasks = retail.tasks("test")[:3]
    tool = retail.agent_tools["get_user_details"]
    real = tool.fn

    def flaky(db, **kwargs):
        if db.authenticated == tasks[0].user_id:
            raise ZeroDivisionError("bug in the tool")
        return real(db, **kwargs)

    monkeypatch.setattr(tool, "fn", flaky)
    result = evaluate(retail, ExpertPolicy(), ScriptedUser(), tasks, k=1, progress=False)
    m = result.metrics
    kinds = [g[0].fault_kind for g in result.trajectories]
    assert kinds[0] == "tool" and kinds[1:] == [None, None], kinds
    assert m["pass^1"] == 1.0 and m["trials"] == 2 and m["tool_fault_rate"] == pytest.approx(1 / 3, abs=1e-6)
