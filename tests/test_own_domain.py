"""Issue 16's yardstick: a domain that is not built in, through the command line end to end.

``tests/library_domain.py`` is written with the public API only and declares nothing for the simulator
or the teacher beyond its tasks' scenarios and ``@tool(authenticates=True)``. The real ``muarl`` console
script runs from a folder holding a copy of it, named ``library_domain:domain`` as a user would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import muarl_console

TESTS = Path(__file__).parent
SPEC = "library_domain:domain"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("own_domain")
    shutil.copy(TESTS / "library_domain.py", folder / "library_domain.py")
    return folder


@pytest.fixture(scope="module")
def evaluated(workdir: Path) -> Path:
    out = workdir / "eval"
    done = muarl_console(workdir, "eval", "--domain", SPEC, "--policy", "expert", "--user", "scripted", "--split",
                  "test", "--k", "2", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    return out


def test_generic_teacher_and_scenario_user_win_every_test_task(evaluated: Path) -> None:
    results = json.loads((evaluated / "results.json").read_text())
    import library_domain

    tests = library_domain.domain.tasks("test")
    assert len(results["tasks"]) == len(tests) > 0
    assert results["metrics"]["pass^1"] == 1.0 and results["metrics"]["pass^2"] == 1.0
    assert results["metrics"]["violation_rate"] == 0.0
    # the teacher acted: every gold write ran, and the out-of-policy renewals were refused (no write)
    trajectories = [json.loads(line) for line in (evaluated / "trajectories.jsonl").read_text().splitlines()]
    writes = {t["task_id"]: [r["name"] for r in t["tool_log"] if r["kind"] == "write" and r["ok"]]
              for t in trajectories}
    for task in tests:
        assert writes[task.id] == [a.name for a in task.gold_actions], task.id
    # the conversation is the library's, not another domain's script
    opening = next(m["content"] for m in trajectories[0]["messages"] if m["role"] == "user")
    assert "phone" not in opening.lower() and "order" not in opening.lower()


def test_view_of_a_plug_in_run_finds_the_tasks_again(workdir: Path, evaluated: Path) -> None:
    config = json.loads((evaluated / "config.json").read_text())
    assert config["domain"] == SPEC
    shown = muarl_console(workdir, "view", str(evaluated), "--out", str(workdir / "view.html"), "--compress", "never")
    assert shown.returncode == 0, shown.stderr
    page = (workdir / "view.html").read_text()
    assert "renew_withheld_card" in page or "third_renewal" in page  # families, hence the tasks, were found


def test_synth_writes_one_record_per_clean_win(workdir: Path) -> None:
    out = workdir / "synth"
    done = muarl_console(workdir, "synth", "--domain", SPEC, "--teacher", "expert", "--user", "scripted", "--split", "train",
                  "--out", str(out))
    assert done.returncode == 0, done.stderr
    import library_domain

    records = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    assert len(records) == len(library_domain.domain.tasks("train"))
    assert all(r["messages"][0]["role"] == "system" for r in records)


@pytest.mark.slow
def test_one_grpo_step_on_the_plug_in_domain(workdir: Path) -> None:
    out = workdir / "grpo"
    done = muarl_console(workdir, "grpo", "--preset", "tiny", "--model", "tiny-random", "--domain", SPEC, "--out", str(out),
                  "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "16",
                  "--max-turns", "3", "--no-progress")
    assert done.returncode == 0, done.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["step"] == 1
    assert (out / "model" / "config.json").exists()
