"""Plug-ins everywhere a name is taken (issue 16 item 3): ``--domain``, ``--policy`` and ``--user`` take
``module:attr``, also in the real ``muarl`` console script run from the folder holding the module; a bad
one is one line on stderr and exit 2; run directories record the specs so view, compare and a resume find
the plug-in again; ``--policy noop`` is the do-nothing baseline.

The plug-in is ``tests/counter_plugin.py``, copied into a temporary folder the subprocess runs in (with
PYTHONPATH cleared, so that only the current directory can provide it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import muarl_console

TESTS = Path(__file__).parent
PLUGIN = "counter_plugin"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plugins")
    shutil.copy(TESTS / f"{PLUGIN}.py", folder / f"{PLUGIN}.py")
    (folder / "raises_on_import.py").write_text('raise RuntimeError("the plug-in is broken")\n')
    return folder


def _eval(workdir: Path, out: str, policy: str = f"{PLUGIN}:expert", *extra: str) -> subprocess.CompletedProcess:
    return muarl_console(workdir, "eval", "--domain", f"{PLUGIN}:domain", "--policy", policy, "--user",
                  f"{PLUGIN}:CounterUser", "--k", "1", "--out", str(workdir / out), "--quiet", *extra)


@pytest.fixture(scope="module")
def expert_run(workdir: Path) -> Path:
    done = _eval(workdir, "expert")
    assert done.returncode == 0, done.stderr
    return workdir / "expert"


@pytest.fixture(scope="module")
def noop_run(workdir: Path) -> Path:
    done = _eval(workdir, "noop", "noop")
    assert done.returncode == 0, done.stderr
    return workdir / "noop"


def test_domain_policy_and_user_of_ones_own_from_the_current_directory(expert_run: Path) -> None:
    results = json.loads((expert_run / "results.json").read_text())
    assert results["metrics"]["pass^1"] == 1.0 and results["metrics"]["violation_rate"] == 0.0
    config = json.loads((expert_run / "config.json").read_text())
    # the specs as given, not the registered names, so that view / compare / resume can load them again
    assert (config["domain"], config["policy"], config["user"]) == (f"{PLUGIN}:domain", f"{PLUGIN}:expert",
                                                                    f"{PLUGIN}:CounterUser")


def test_a_zero_argument_factory_names_a_domain(workdir: Path) -> None:
    done = muarl_console(workdir, "gold", f"{PLUGIN}:make_domain", "--split", "test")
    assert done.returncode == 0, done.stderr
    assert "all gold trajectories score 1.0" in done.stdout


def test_noop_is_the_do_nothing_floor(noop_run: Path, workdir: Path) -> None:
    results = json.loads((noop_run / "results.json").read_text())
    # it wins exactly the tasks whose gold is "change nothing" (half of them), and never calls a tool
    assert results["metrics"]["pass^1"] == 0.5
    trajectories = [json.loads(line) for line in (noop_run / "trajectories.jsonl").read_text().splitlines()]
    assert trajectories and all(not t["tool_log"] for t in trajectories)
    for command in ("eval", "rollout", "chat"):
        assert "noop" in muarl_console(workdir, command, "--help").stdout


def test_view_finds_a_plug_in_runs_tasks_again(expert_run: Path, workdir: Path) -> None:
    done = muarl_console(workdir, "view", str(expert_run), "--compress", "never", "--out", str(workdir / "view.html"))
    assert done.returncode == 0, done.stderr
    page = (workdir / "view.html").read_text()
    assert '"family":"bump_other"' in page.replace(" ", "") and "Ask to add one to counter" in page


def test_view_of_a_rollout_finds_the_plug_in_through_its_summary(workdir: Path) -> None:
    out = workdir / "rollout"
    done = muarl_console(workdir, "rollout", "--domain", f"{PLUGIN}:domain", "--policy", f"{PLUGIN}:expert", "--user",
                  f"{PLUGIN}:CounterUser", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["domain"] == f"{PLUGIN}:domain"
    done = muarl_console(workdir, "view", str(out), "--compress", "never")
    assert done.returncode == 0, done.stderr
    assert "Ask to add one to counter" in (out / "report.html").read_text()


def test_compare_and_resume_find_the_plug_in(expert_run: Path, noop_run: Path, workdir: Path) -> None:
    done = muarl_console(workdir, "compare", str(noop_run), str(expert_run), "--json", "--samples", "200")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["domain"] == f"{PLUGIN}:domain" and report["shared_tasks"] == 4
    # an interrupted run (trajectories only) pairs with a finished one through its config.json
    cut = workdir / "cut"
    shutil.copytree(noop_run, cut)
    (cut / "results.json").unlink()
    done = muarl_console(workdir, "compare", str(cut), str(expert_run), "--json", "--samples", "200")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["shared_tasks"] == 4
    # resuming: the same command on the same directory finds every episode already done
    again = _eval(workdir, "expert")
    assert again.returncode == 0, again.stderr
    assert "0 episodes played, 4 already done" in " ".join(again.stdout.split())


@pytest.mark.parametrize(("option", "spec", "says"), [
    ("--domain", "counter_plugn:domain", "cannot import module 'counter_plugn'"),
    ("--domain", f"{PLUGIN}:domian", f"module '{PLUGIN}' has no attribute 'domian' (its domains: domain)"),
    ("--domain", f"{PLUGIN}:expert", f"{PLUGIN}.expert is a CounterExpert, not a Domain"),
    ("--domain", f"{PLUGIN}:needs_arguments", "cannot be called without arguments"),
    ("--domain", "raises_on_import:domain", "importing module 'raises_on_import' raised RuntimeError: the plug-in "
                                            "is broken"),
    ("--policy", "no_such_policy_module:agent", "--policy 'no_such_policy_module:agent': cannot import module"),
    ("--policy", f"{PLUGIN}:exprt", f"module '{PLUGIN}' has no attribute 'exprt' (its policies: CannotPlayTeacher, CounterExpert, expert)"),
    ("--policy", f"{PLUGIN}:not_a_policy", f"{PLUGIN}.not_a_policy is an int, not a Policy"),
    ("--policy", f"{PLUGIN}:CounterUser", f"{PLUGIN}.CounterUser() returned a CounterUser, not a Policy"),
    ("--policy", "expret", "unknown policy 'expret'; use expert, expert-noconfirm, noop"),
    ("--user", f"{PLUGIN}:expert", f"--user '{PLUGIN}:expert': {PLUGIN}.expert is a CounterExpert, not a UserSimulator"),
    ("--user", f"{PLUGIN}:CounterUsr", "has no attribute 'CounterUsr' (its users: CannotPlayUser, CounterUser)"),
    ("--user", "scriptd", "unknown user 'scriptd'"),
])
def test_a_bad_plug_in_is_one_line_and_exit_2(workdir: Path, option: str, spec: str, says: str) -> None:
    args = {"--domain": f"{PLUGIN}:domain", "--policy": f"{PLUGIN}:expert", "--user": f"{PLUGIN}:CounterUser"}
    args[option] = spec
    done = muarl_console(workdir, "rollout", *[x for kv in args.items() for x in kv], "--out", str(workdir / "bad"))
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("muarl: error: ") and says in err, err
    assert "Traceback" not in done.stderr


def test_known_prefixes_win_over_module_attr() -> None:
    """``openai:http://host:8000/v1#m`` holds colons, and ``llm:`` / ``replay:`` / ``hf:`` are specs, not
    modules named openai, llm, replay or hf."""
    from muarl.factory import SpecError, make_policy, make_user
    from muarl.policies.openai import OpenAIPolicy
    from muarl.users.llm import LLMUser

    assert isinstance(make_policy("openai:http://127.0.0.1:9/v1#m"), OpenAIPolicy)
    assert isinstance(make_user("llm:http://127.0.0.1:9/v1#m"), LLMUser)
    with pytest.raises(SpecError, match="no such file"):
        make_user("replay:/no/such/file.jsonl")
    with pytest.raises(SpecError, match="expected openai:URL#MODEL"):
        make_policy("openai:http://127.0.0.1:9/v1")


def test_the_loader_takes_objects_and_zero_argument_factories() -> None:
    import counter_plugin
    from muarl.domain import Domain, get_domain
    from muarl.factory import make_policy, make_user
    from muarl.plugins import PluginError, load

    assert load(f"{PLUGIN}:domain", Domain, "--domain", "domains") is counter_plugin.domain
    assert load(f"{PLUGIN}:make_domain", Domain, "--domain", "domains") is counter_plugin.domain
    assert isinstance(make_user(f"{PLUGIN}:CounterUser"), counter_plugin.CounterUser)
    assert make_policy(f"{PLUGIN}:expert") is counter_plugin.expert
    assert make_policy("noop").name == "noop"
    with pytest.raises(PluginError, match="expected module:attribute"):
        load(f"{PLUGIN}:", Domain, "--domain", "domains")
    with pytest.raises(KeyError, match="has no attribute 'nope'"):
        get_domain(f"{PLUGIN}:nope")
