"""The BFCL-V3 multi-turn bridge: BFCL's data, classes and official checker inside muarl episodes.

Real components only: the ``bfcl_eval`` package's data, its executable classes and its
``multi_turn_checker``. All 800 entries are ``scripts/bfcl_ground_truth.py``; these tests run samples.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest

from conftest import play_tasks, require

require(importlib.util.find_spec("bfcl_eval") is not None,
        "the bfcl extra is not installed (bash scripts/install.sh --dev)")

from muarl.bridges.bfcl import (  # noqa: E402
    CATEGORIES,
    GroundTruthPolicy,
    _parse_call,
    _TruthSession,
    category_data,
    decode_turns,
)
from muarl.cli import main  # noqa: E402
from muarl.domain import get_domain  # noqa: E402
from muarl.rollout import EpisodeConfig, run_episode  # noqa: E402
from muarl.users.base import STOP  # noqa: E402
from muarl.users.scripted import ScriptedUser  # noqa: E402


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_through_muarl_is_valid_for_bfcls_checker(category):
    domain = get_domain(f"bfcl:{category}")
    assert len(domain.tasks()) == 200
    tasks = domain.tasks()[:12]
    trajs = play_tasks(domain, tasks, GroundTruthPolicy(), max_turns=60)
    for task, traj in zip(tasks, trajs, strict=True):
        assert traj.reward.reward == 1.0, (task.id, traj.reward.diff)
        assert traj.reward.checks[0].name == "bfcl multi_turn_checker"
        assert traj.stop_reason == "user_stop"
        assert sum(m.role == "user" for m in traj.messages) == len(task.context["bfcl"]["turns"]) + 1


class _Broken(GroundTruthPolicy):
    """The ground truth with one change, to show the checker (not muarl) decides."""

    def __init__(self, change):
        self.change = change

    def session(self, domain, task, seed=None):
        truth = [list(t) for t in category_data(task.domain.split(":")[1]).answers[task.id]]
        return _TruthSession(self.change(truth))


def test_checker_rejects_a_skipped_turn_and_a_wrong_argument():
    domain = get_domain("bfcl:base")
    task = domain.task("multi_turn_base_0")

    def skip_last(truth):
        return truth[:-1] + [[]]

    def wrong_folder(truth):
        return [[c.replace("folder='document'", "folder='archive'") for c in turn] for turn in truth]

    assert any("folder='document'" in c for turn in category_data("base").answers[task.id] for c in turn)
    skipped = play_tasks(domain, [task], _Broken(skip_last), max_turns=60)[0]
    wrong = play_tasks(domain, [task], _Broken(wrong_folder), max_turns=60)[0]
    assert skipped.reward.reward == 0.0 and "empty_turn_model_response" in skipped.reward.diff[0]
    assert wrong.reward.reward == 0.0 and wrong.reward.diff


def test_miss_func_hides_the_held_out_function_until_its_turn_but_the_env_runs_it():
    domain = get_domain("bfcl:miss_func")
    task = domain.task("multi_turn_miss_func_0")
    info = task.context["bfcl"]
    assert info["held_out"] == {"3": ["sort"]}
    view = domain.for_task(task)
    names = {t.name for t in view.tools}
    assert "sort" not in names and {"cd", "mv", "grep", "post_tweet"} <= names
    assert "add" not in names  # MathAPI is not involved in this entry
    assert "sort" in info["turns"][3] and "I have updated some more functions" in info["turns"][3]
    env = view.env(task)
    assert env.call("cd", {"folder": "document"}).ok
    record = env.call("sort", {"file_name": "final_report.pdf"})
    assert record.ok, record.output


def test_tools_execute_in_bfcl_instances_private_to_each_episode():
    domain = get_domain("bfcl:base")
    task = domain.task("multi_turn_base_0")
    view = domain.for_task(task)
    one, two = view.env(task), view.env(task)
    assert one.call("cd", {"folder": "document"}).ok
    assert one.call("mkdir", {"dir_name": "new_dir"}).ok
    listing_one = json.loads(one.call("ls", {}).output)["current_directory_content"]
    assert "new_dir" in listing_one
    two_ls = two.call("ls", {}).output
    assert "new_dir" not in two_ls
    bad = one.call("cd", {"nope": 1})
    assert bad.error == "invalid_arguments"


def test_user_turns_come_from_the_data_and_the_scripted_user_plays_them():
    domain = get_domain("bfcl:miss_param")
    task = domain.tasks()[3]
    entry = category_data("miss_param").entries[task.id]
    expected = ["\n".join(m["content"] for m in turn) for turn in entry["question"]]
    assert task.context["bfcl"]["turns"] == expected
    traj = asyncio.run(run_episode(domain, task, GroundTruthPolicy(), ScriptedUser(), config=EpisodeConfig(60)))
    said = [m.content for m in traj.messages if m.role == "user"]
    assert said[:-1] == expected and said[-1] == STOP
    assert decode_turns(traj, len(expected)) != []


def test_positional_ground_truth_arguments_are_named_from_the_class_signature():
    assert _parse_call("sort('final_report.pdf')") == ("sort", {"file_name": "final_report.pdf"})
    assert _parse_call("mean([37])") == ("mean", {"numbers": [37]})
    assert _parse_call("cd(folder='temp')") == ("cd", {"folder": "temp"})


@pytest.mark.slow
def test_a_model_policy_runs_through_muarl_eval_and_is_graded_by_bfcl(tmp_path):
    out = tmp_path / "run"
    code = main(["eval", "--domain", "bfcl:base", "--policy", "hf:tiny", "--k", "1", "--limit", "1",
                 "--max-new-tokens", "8", "--max-turns", "6", "--quiet", "--out", str(out)])
    assert code == 0
    traj = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert traj["reward"]["checks"][0]["name"] == "bfcl multi_turn_checker"
    assert traj["domain"].startswith("bfcl:base/")  # the entry's own view: its classes' functions


def test_unknown_category_is_a_clear_error():
    with pytest.raises(KeyError, match="bfcl:base, bfcl:miss_func"):
        get_domain("bfcl:simple")
