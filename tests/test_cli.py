"""The command line as a user runs it: real subprocesses and exit codes (the README's own-domain example
is an excerpt of docs/domains.md, whose commands tests/test_domains_guide.py runs)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def muarl(*args: str, cwd: Path = ROOT, env_path: Path | None = None) -> subprocess.CompletedProcess:
    env = None
    if env_path is not None:
        import os

        env = {**os.environ, "PYTHONPATH": f"{env_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "muarl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_domains_lists_task_counts_per_split():
    out = muarl("domains", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert {"retail", "airline", "telecom"} <= set(rows)
    assert rows["telecom"]["user_tools"] > 0 and rows["retail"]["user_tools"] == 0
    assert all(rows[d]["test"] > 0 and rows[d]["train"] > 0 for d in ("retail", "airline", "telecom"))


def test_gold_all_builtin_domains_pass():
    out = muarl("gold", "all", "--json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] and report["failures"] == []
    assert {s["domain"] for s in report["summary"]} == {"retail", "airline", "telecom"}
    assert all(s["passed"] == s["tasks"] > 0 for s in report["summary"])


def test_gold_fails_loudly_on_an_unsolvable_task(tmp_path):
    """A domain of our own whose shipped task set holds one broken gold action: exit 1, the task named."""
    (tmp_path / "broken_domain.py").write_text('''
from pathlib import Path
from muarl.domain import get_domain, save_tasks, Domain
from muarl.types import Action

retail = get_domain("retail")
tasks = retail.tasks("test")[:3]
bad = tasks[1].model_copy(deep=True)
bad.gold_actions.append(Action(name="cancel_pending_order",
                               arguments={"order_id": "#W0000000", "reason": "no longer needed"}))
path = Path(__file__).with_name("broken_tasks.json")
save_tasks([tasks[0], bad, tasks[2]], path)
DOMAIN = Domain(name="broken", description="", policy="", tools=retail.tools, build_db=retail.build_db,
                build_tasks=retail.build_tasks, owner_of=retail.owner_of, db_size=retail.db_size, tasks_file=path)
''')
    out = muarl("gold", "broken_domain:DOMAIN", "--split", "test", "--json", env_path=tmp_path)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert not report["ok"] and [f["task"] for f in report["failures"]] == [json.loads(
        (tmp_path / "broken_tasks.json").read_text())["tasks"][1]["id"]]
    assert "order #W0000000 not found" in report["failures"][0]["failed_actions"][0]


def test_unknown_domain_is_a_clear_error():
    out = muarl("gold", "no_such_domain")
    assert out.returncode == 2
    assert "unknown domain 'no_such_domain'" in out.stderr and "retail" in out.stderr


def test_grpo_command_line_reaches_the_config():
    """Flags of `muarl grpo` land in the GRPOConfig the run gets; absent ones keep the preset's values."""
    from muarl.cli import build_parser
    from muarl.cli.grpo import grpo_config

    base = ["grpo", "--model", "tiny", "--domain", "retail-lite", "--out", "runs/x", "--preset", "tiny"]
    plain = grpo_config(build_parser().parse_args(base)).config
    assert plain.penalize_violations is False and plain.kl_beta == 0.001
    config = grpo_config(build_parser().parse_args(base + ["--penalize-violations", "--kl-beta", "0.01",
                                                           "--max-turns", "9", "--dynamic-sampling",
                                                           "--max-rollout-batches", "2", "--num-iterations", "3"])).config
    assert config.penalize_violations is True and config.kl_beta == 0.01 and config.max_turns == 9
    assert config.dynamic_sampling is True and config.max_rollout_batches == 2 and plain.max_rollout_batches == 4
    assert config.num_iterations == 3 and plain.num_iterations == 1
    assert (config.model, config.domain) == ("tiny", "retail-lite")
