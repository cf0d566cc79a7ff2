"""muarl chat: a person (here, the test) types the user's side against the expert policy, in a real
`python -m muarl chat` process fed on stdin; the episode is scored and saved whatever the ending."""

import io
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from muarl.cli import main
from muarl.domain import get_domain
from muarl.factory import make_policy
from muarl.human import parse_arguments, run_chat
from muarl.policies.base import Policy, PolicySession
from muarl.rollout import load_trajectories
from muarl.users.base import STOP

ROOT = Path(__file__).resolve().parents[1]
TASK = "retail-test-0-00015"  # Ivan Hansen (zip 43270) cancels pending order #W1625474, ordered by mistake
OPEN = "Hi, I want to cancel my order #W1625474."
NAME = "My name is Ivan Hansen and my zip code is 43270."
REASON = "It was ordered by mistake."


def chat_process(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "COLUMNS": "160"}
    return subprocess.Popen([sys.executable, "-m", "muarl", "chat", *args], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def chat(lines: list[str], *args: str) -> subprocess.CompletedProcess:
    proc = chat_process(*args)
    out, err = proc.communicate("".join(f"{line}\n" for line in lines), timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def saved(path: Path):
    found = list(load_trajectories(path).values())
    assert len(found) == 1
    return found[0]


def play(domain: str, task: str, lines: list[str], policy: str = "expert"):
    """The same chat in-process (a StringIO for stdin), returning the trajectory and what was printed."""
    d = get_domain(domain)
    screen = io.StringIO()
    traj = run_chat(d, d.task(task), make_policy(policy), stream=io.StringIO("".join(f"{x}\n" for x in lines)),
                    console=Console(file=screen, width=160))
    return traj, screen.getvalue()


def test_a_person_who_gives_the_right_facts_and_confirms_scores_1(tmp_path):
    file = tmp_path / "chats.jsonl"
    done = chat([OPEN, NAME, REASON, "yes", "/done Thanks, bye!"], "--domain", "retail", "--task", TASK,
                "--policy", "expert", "--save", str(file))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    # the scenario, the tool calls and their results as they happened, then the score
    assert "your task: retail-test-0-00015" in out and "#W1625474" in out
    assert 'find_user_id_by_name_zip({"first_name": "Ivan"' in out and "result of find_user_id_by_name_zip" in out
    assert out.index("cancel_pending_order(") < out.index("result of cancel_pending_order") < out.index("reward 1.0")
    traj = saved(file)
    assert traj.reward.reward == 1.0 and traj.reward.db_match and not traj.reward.violations
    assert traj.stop_reason == "user_stop"
    assert [r.name for r in traj.tool_log if r.kind == "write"] == ["cancel_pending_order"]
    users = [m.content for m in traj.messages if m.role == "user"]
    assert users == [OPEN, NAME, REASON, "yes", f"Thanks, bye! {STOP}"]


def test_refusing_the_proposal_leaves_the_order_alone_and_scores_0():
    traj, screen = play("retail", TASK, [OPEN, NAME, REASON, "no, don't do that", "/done"])
    assert traj.reward.reward == 0.0 and not [r for r in traj.tool_log if r.kind == "write"]
    assert "reward 0.0" in screen and 'orders["#W1625474"].status' in screen  # the diff from gold is shown


def test_end_of_input_ends_cleanly_and_keeps_the_conversation(tmp_path):
    file = tmp_path / "chat.jsonl"
    done = chat([OPEN, NAME], "--domain", "retail", "--task", TASK, "--save", str(file))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "end of input" in done.stdout
    traj = saved(file)
    assert traj.stop_reason == "user_stop" and traj.metadata["user_eof"] == 1
    assert [m.content for m in traj.messages if m.role == "user"] == [OPEN, NAME, STOP]
    assert [r.name for r in traj.tool_log][:2] == ["find_user_id_by_name_zip", "get_user_details"]
    assert traj.reward is not None and traj.reward.reward == 0.0  # nothing was cancelled, and it says so


def test_end_of_input_before_a_word_is_a_simulator_fault_not_a_crash(tmp_path):
    file = tmp_path / "chat.jsonl"
    done = chat([], "--domain", "retail", "--task", TASK, "--save", str(file))
    assert done.returncode == 0, done.stderr[-2000:]
    traj = saved(file)
    assert traj.sim_fault and traj.stop_reason == "sim_fault" and "end of input" in traj.metadata["sim_fault"]


def test_quit_and_commands_do_not_become_messages():
    traj, screen = play("retail", TASK, ["/help", "/tools", "/phone check_status_bar", OPEN, "/nonsense",
                                         "/task", "", NAME, "/quit", "never read"])
    assert [m.content for m in traj.messages if m.role == "user"] == [OPEN, NAME, STOP]
    assert traj.metadata["user_quit"] == 1 and "user_eof" not in traj.metadata
    assert "unknown command /nonsense" in screen and "you have no device tools" in screen
    assert screen.count("your task: retail-test-0-00015") == 2  # shown at the start and on /task


def test_dual_control_the_person_acts_on_their_phone():
    """Telecom: the person runs phone tools; they land in the env's log as user calls and are graded."""
    lines = ["My phone asks for a PUK code and has no signal.", "555-942-5640", "/tools",
             "/phone check_status_bar mode=", "/phone check_status_bar", "It says SIM locked, PUK required.",
             "ok thanks"]
    traj, screen = play("telecom", "telecom-test-0-00000", lines)
    user_calls = [(r.name, r.ok) for r in traj.tool_log if r.actor == "user"]
    assert user_calls == [("check_status_bar", False), ("check_status_bar", True)]
    assert "invalid arguments for check_status_bar" in screen and "SIM locked (PUK required)" in screen
    assert "toggle_airplane_mode" in screen  # the /tools table
    assert traj.stop_reason == "transfer" and traj.reward.reward == 1.0
    assert "result of transfer_to_human_agents" in screen  # the last call's result is shown too


def test_parse_arguments():
    assert parse_arguments("") == {}
    assert parse_arguments('{"mode": "4g", "n": 2}') == {"mode": "4g", "n": 2}
    assert parse_arguments("mode=4g n=2 on=true name='a b'") == {"mode": "4g", "n": 2, "on": True, "name": "a b"}
    for bad in ["mode", "{oops", "[1, 2]", "=3"]:
        with pytest.raises(ValueError):
            parse_arguments(bad)


def test_ctrl_c_at_the_prompt_ends_the_conversation_and_saves_it(tmp_path):
    file = tmp_path / "chat.jsonl"
    proc = chat_process("--domain", "retail", "--task", TASK, "--save", str(file))
    proc.stdin.write(OPEN + "\n")
    proc.stdin.flush()
    seen, deadline = "", time.time() + 60
    while seen.count("you>") < 2 and time.time() < deadline:  # the agent answered and the prompt is back
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            seen += os.read(proc.stdout.fileno(), 65536).decode()
    assert seen.count("you>") >= 2, seen[-2000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    traj = saved(file)
    assert traj.metadata["user_quit"] == 1 and traj.stop_reason == "user_stop"
    assert [m.content for m in traj.messages if m.role == "user"] == [OPEN, STOP]


def test_chat_cli_errors(capsys):
    assert main(["chat", "--domain", "retail", "--task", "retail-test-9-99999"]) == 2
    assert "has no task 'retail-test-9-99999'" in capsys.readouterr().err
    assert main(["chat", "--domain", "nowhere"]) == 2
    assert "unknown domain 'nowhere'" in capsys.readouterr().err
    assert main(["chat", "--domain", "retail", "--policy", "robot"]) == 2
    assert "unknown policy 'robot'" in capsys.readouterr().err


class InterruptedAgent(Policy):
    """The expert, but the person presses Ctrl-C (a real SIGINT to this process) during its second turn."""

    def __init__(self):
        self.inner = make_policy("expert")

    def session(self, domain, task, seed=None):
        return _Interrupted(self.inner.session(domain, task))


class _Interrupted(PolicySession):
    def __init__(self, inner):
        self.inner, self.turns = inner, 0

    async def next(self, new_messages):
        self.turns += 1
        if self.turns == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return await self.inner.next(new_messages)


def test_ctrl_c_while_the_agent_works_ends_at_the_next_prompt():
    d = get_domain("retail")
    before = signal.getsignal(signal.SIGINT)
    traj = run_chat(d, d.task(TASK), InterruptedAgent(), stream=io.StringIO(f"{OPEN}\n{NAME}\n{REASON}\n"),
                    console=Console(file=io.StringIO()))
    assert traj.metadata["user_quit"] == 1 and traj.reward is not None
    assert [m.content for m in traj.messages if m.role == "user"] == [OPEN, NAME, STOP]
    assert signal.getsignal(signal.SIGINT) is before  # the chat's handler is removed again
