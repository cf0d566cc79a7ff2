"""No silent wrong output (issue 16 item 4): each path that used to give a plausible but wrong result
without a word now says what is wrong, or stops.

- a tasks file is validated: gold_actions required (``[]`` for a no-write task), and a JSON or validation
  error names the file and the task; a missing tasks file is an error, not generated tasks;
- an answer to a question is not consent: only a yes to the agent's request for approval licenses a write;
- generation warns when a family ran out of distinct tasks below its share;
- ``muarl synth`` writes no data set from a teacher (or user) that failed, and one record per clean win;
- ``muarl eval`` over episodes whose user or teacher raised reports faults, never a success over them.

The plug-in used throughout is ``tests/counter_plugin.py`` (its own domain, expert and user).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

import counter_plugin
from muarl.cli import main
from muarl.domain import TasksFileError, load_tasks, save_tasks
from muarl.policies.noop import NoopPolicy
from muarl.rewards import asks_consent, find_violations
from muarl.synth import SynthesisFailed, synthesize
from muarl.types import Message, ToolCall, Trajectory

SPEC = "counter_plugin:domain"
DOMAIN = counter_plugin.domain


# -- tasks files ---------------------------------------------------------------------------------------------
def _task_dicts() -> list[dict]:
    return [t.model_dump(mode="json") for t in DOMAIN.tasks("test")]


def _write(path: Path, tasks: list[dict]) -> Path:
    path.write_text(json.dumps({"tasks": tasks}))
    return path


def test_a_task_without_gold_actions_is_refused_naming_file_and_task(tmp_path: Path) -> None:
    tasks = _task_dicts()
    del tasks[0]["gold_actions"]  # before: loaded as a no-write task, so doing nothing scored 1.0
    path = _write(tmp_path / "tasks.json", tasks)
    with pytest.raises(TasksFileError, match=rf"tasks file {path}: task 'counter-test-000' \(index 0\) has no "
                                             r"gold_actions; .*\[\] for a task that needs none"):
        load_tasks(path)
    tasks[0]["gold_actions"] = []  # explicit: a no-write task is fine
    assert load_tasks(_write(path, tasks))[0].gold_actions == []


def test_json_and_validation_errors_name_the_file_and_the_task(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"tasks": [\n {"id": "x",}\n]}')
    with pytest.raises(TasksFileError, match=rf"tasks file {broken}: not valid JSON: .* at line 2 column"):
        load_tasks(broken)
    tasks = _task_dicts()
    tasks[1]["split"] = "holdout"
    path = _write(tmp_path / "tasks.json", tasks)
    with pytest.raises(TasksFileError, match=r"task 'counter-test-001' \(index 1\) is not a valid task: split: "):
        load_tasks(path)
    tasks = _task_dicts()
    del tasks[2]["id"]
    with pytest.raises(TasksFileError, match=r"task at index 2 is not a valid task: id: Field required"):
        load_tasks(_write(path, tasks))
    tasks = _task_dicts()
    tasks[3]["id"] = tasks[0]["id"]
    with pytest.raises(TasksFileError, match=r"task 'counter-test-000' \(index 3\) repeats the id of index 0"):
        load_tasks(_write(path, tasks))
    path.write_text('[{"id": "x"}]')
    with pytest.raises(TasksFileError, match=r'expected a JSON object with a "tasks" list'):
        load_tasks(path)


def test_every_shipped_tasks_file_still_loads() -> None:
    shipped = sorted((Path(__file__).parents[1] / "src" / "muarl" / "domains").glob("*/tasks.json"))
    assert shipped
    for path in shipped:
        assert load_tasks(path), path


def test_a_missing_tasks_file_is_an_error_not_generated_tasks(tmp_path: Path) -> None:
    missing = dataclasses.replace(DOMAIN, tasks_file=tmp_path / "tasks.json")
    with pytest.raises(FileNotFoundError, match=rf"domain counter-desk: tasks file {tmp_path / 'tasks.json'} does "
                                                "not exist"):
        missing.tasks()
    save_tasks(DOMAIN.tasks(), tmp_path / "tasks.json")  # once it exists, it is what the domain plays
    assert [t.id for t in missing.tasks()] == [t.id for t in DOMAIN.tasks()]
    generated = dataclasses.replace(DOMAIN, tasks_file=None)  # no file named: generated, as before
    assert len(generated.tasks("test")) == 4


def test_the_command_line_says_which_tasks_file_is_wrong(tmp_path: Path, monkeypatch, capsys) -> None:
    tasks = _task_dicts()
    del tasks[1]["gold_actions"]
    path = _write(tmp_path / "tasks.json", tasks)
    (tmp_path / "bad_tasks_plugin.py").write_text(
        "import dataclasses\nfrom pathlib import Path\nimport counter_plugin\n"
        f"domain = dataclasses.replace(counter_plugin.domain, tasks_file=Path({str(path)!r}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["gold", "bad_tasks_plugin:domain"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}: task 'counter-test-001' (index 1) has no gold_actions" in err


# -- consent -------------------------------------------------------------------------------------------------
def _violations(agent_asks: str, user_says: str) -> list[str]:
    """The violations of: login, the agent says ``agent_asks``, the user ``user_says``, the agent bumps."""
    task = DOMAIN.tasks("test")[0]
    env = DOMAIN.env(task)
    env.call("login", {"pin": task.scenario.known["pin"]}, call_id="c0")
    env.call("bump", {"counter_id": task.scenario.known["counter_id"]}, call_id="c1")
    messages = [Message(role="user", content="Hi, please add one to my counter."),
                Message(role="assistant", tool_calls=[ToolCall(id="c0", name="login", arguments={})]),
                Message(role="tool", content="U0", tool_call_id="c0"),
                Message(role="assistant", content=agent_asks),
                Message(role="user", content=user_says),
                Message(role="assistant", tool_calls=[ToolCall(id="c1", name="bump", arguments={})]),
                Message(role="tool", content="bumped", tool_call_id="c1")]
    traj = Trajectory(task_id=task.id, domain=DOMAIN.name, messages=messages, tool_log=env.log)
    return [v.kind for v in find_violations(DOMAIN, task, traj)]


def test_an_answer_to_a_question_is_not_consent() -> None:
    # before: "Sure" in a short reply counted as an explicit confirmation of the next write
    assert _violations("Could you tell me your card number?", "Sure, my card number is 313295.") == \
        ["unconfirmed_write"]
    assert _violations("Which counter is it?", "Yes, C0.") == ["unconfirmed_write"]
    assert _violations("Please confirm your email address.", "Yes, it is ada@example.com.") == \
        ["unconfirmed_write"]
    # a yes to a request for approval still is
    assert _violations("I will add one to counter C0. Would you like me to proceed? (yes/no)", "Sure.") == []
    assert _violations("Shall I add one to counter C0?", "Yes, please do.") == []
    assert _violations("I'll bump C0. Please confirm.", "I confirm.") == []


@pytest.mark.parametrize(("text", "asks"), [
    ("Would you like me to proceed? (yes/no)", True), ("Shall I cancel it?", True), ("Is that okay?", True),
    ("Do you want me to return both items?", True), ("Can you confirm that you want the refund?", True),
    ("Could you confirm your zip code?", False), ("What is your card number?", False),
    ("Is there anything else I can help you with?", False),
])
def test_asks_consent(text: str, asks: bool) -> None:
    assert asks_consent(text) is asks


# -- task generation -----------------------------------------------------------------------------------------
def test_generation_warns_when_a_family_falls_short_of_its_share() -> None:
    from muarl.taskgen import Draft, FamilyShareWarning, generate
    from muarl.types import Intent, Scenario

    def common(rng, db, user: str) -> Draft:
        return Draft(scenario=Scenario(persona="p", intents=[Intent(description="ask")]), instruction="ask",
                     gold_actions=[], required_outputs=[user])

    def rare(rng, db, user: str) -> Draft | None:  # only four members can host it: it runs out
        return common(rng, db, user) if user in {"U0", "U1", "U2", "U3"} else None

    families = {"common": (1.0, common), "rare": (1.0, rare)}
    users = list(DOMAIN.database().tables["users"])
    with pytest.warns(FamilyShareWarning, match=r"counter-desk: .*rare in train: got \d of about 10 asked"):
        tasks = generate(DOMAIN, 0, {"train": 20}, families, users)
    assert len(tasks) == 20 and sum(t.family == "rare" for t in tasks) <= 4
    with warnings.catch_warnings():  # a mix that was met says nothing
        warnings.simplefilter("error")
        generate(DOMAIN, 0, {"train": 4}, {"common": (1.0, common)}, users)


# -- synth ---------------------------------------------------------------------------------------------------
def test_synth_refuses_a_teacher_that_raised_naming_the_tasks(tmp_path: Path) -> None:
    (tmp_path / "sft.jsonl").write_text('{"stale": true}\n')  # an earlier run's data must not stay behind
    with pytest.raises(SynthesisFailed, match=r"the teacher raised for 3 tasks: counter-train-000 \(policy_fault: "
                                              r".*cannot play task counter-train-000: no tool authenticates"):
        synthesize([DOMAIN], counter_plugin.CannotPlayTeacher(), counter_plugin.CounterUser(), tmp_path,
                   progress=False)
    assert not (tmp_path / "sft.jsonl").exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["refused"] and len(report["failures"]) == 3


def test_synth_refuses_when_too_few_episodes_are_clean_wins(tmp_path: Path) -> None:
    with pytest.raises(SynthesisFailed, match=r"none of the 3 episodes is a clean win .*counter-train-000 \(reward: "
                                              r"reward 0"):
        synthesize([DOMAIN], NoopPolicy(), counter_plugin.CounterUser(), tmp_path / "none", families=["bump"],
                   progress=False)
    assert not (tmp_path / "none" / "sft.jsonl").exists()
    with pytest.raises(SynthesisFailed, match=r"only 3 of 6 episodes are clean wins, below the 0.75 asked"):
        synthesize([DOMAIN], NoopPolicy(), counter_plugin.CounterUser(), tmp_path / "few", min_kept=0.75,
                   progress=False)
    assert not (tmp_path / "few" / "sft.jsonl").exists()


def test_synth_writes_one_record_per_clean_win(tmp_path: Path) -> None:
    report = synthesize([DOMAIN], counter_plugin.expert, counter_plugin.CounterUser(), tmp_path, n=2,
                        progress=False)
    records = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(records) == report.as_dict()["kept_total"] == 12 and report.refused is None
    raw = [Trajectory.model_validate_json(line)
           for line in (tmp_path / "trajectories" / "counter-desk.jsonl").read_text().splitlines()]
    assert all(t.reward.reward == 1.0 and not t.reward.violations for t in raw)


def test_synth_command_fails_and_writes_no_data(tmp_path: Path, capsys) -> None:
    out = tmp_path / "synth"
    code = main(["synth", "--domain", SPEC, "--teacher", "noop", "--user", "counter_plugin:CounterUser",
                 "--families", "bump", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "none of the 3 episodes is a clean win" in err, err
    assert not (out / "sft.jsonl").exists()
    assert json.loads((out / "config.json").read_text())["domains"] == [SPEC]  # `muarl view` finds the tasks


# -- eval ----------------------------------------------------------------------------------------------------
def test_eval_over_a_user_that_cannot_play_fails_clearly(tmp_path: Path, capsys) -> None:
    code = main(["eval", "--domain", SPEC, "--policy", "counter_plugin:expert", "--user",
                 "counter_plugin:CannotPlayUser", "--k", "1", "--quiet", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1 and "pass^1" not in captured.out  # no success number over conversations never played
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "every one of the 4 episodes faulted (user 4)" in err
    assert "cannot play task counter-test-000" in err


def test_eval_counts_the_episodes_a_teacher_could_not_play_as_failures_and_says_so(tmp_path: Path, capsys) -> None:
    """A policy that cannot play a task failed it (issue 34): pass^1 is 0.5, not 1.0 over the other half."""
    code = main(["eval", "--domain", SPEC, "--policy", "counter_plugin:CannotPlayTeacher", "--user",
                 "counter_plugin:CounterUser", "--k", "1", "--quiet", "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "50.0% of episodes faulted (policy 2; policy faults counted as failures" in out
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert metrics["faults"] == {"policy": 2} and metrics["episodes"] == 4 and metrics["pass^1"] == 0.5
