"""Data to teach an LLM to play the customer (``muarl synth --side user``), and the embedded server of such a
model (``--user llm:MODEL_DIR``): issue 42, item 4's user model."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from muarl.chat import ChatFormat
from muarl.domain import get_domain
from muarl.rollout import load_trajectories
from muarl.serve import Generator, GenRequest
from muarl.synth import from_chat_record
from muarl.train.data import tokenize_conversation
from muarl.users.llm import LLMUser, parse_stop
from muarl.users.user_side import user_messages

DOMAIN = "retail-lite-forgetful"


def synth(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["muarl", "synth", "--domain", DOMAIN, "--side", "user", "--families", "cancel_order",
                           "return_items", "--out", "user-data", *extra], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_user_side_records_are_the_llm_users_own_requests_with_its_lines_as_targets(tmp_path: Path) -> None:
    """``muarl synth --side user`` from a fresh directory: every record is, message for message, what a
    :class:`LLMUserSession` sends its endpoint in that episode (its system prompt with the task, the agent's
    greeting, then the agent's words that passed it the turn, never tool calls or results), with the scripted
    user's lines as the targets, the last one ending the conversation with its marker. Tokenized for SFT,
    every target starts right where the user server's rendering of that same history ends, so the fine-tuned
    model is served the prompt it learned under."""
    from muarl.models import load

    done = synth(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "user-data" / "sft.jsonl").read_text().splitlines()]
    episodes = {t.task_id: t for t in load_trajectories(tmp_path / "user-data" / "trajectories" / f"{DOMAIN}.jsonl")
                .values()}
    tasks = {t.id: t for t in get_domain(DOMAIN).tasks("train")}
    assert len(records) >= 50 and {r["side"] for r in records} == {"user"}
    llm_user = LLMUser("http://127.0.0.1:1/v1", "user")
    for record in records:
        traj, messages = episodes[record["task_id"]], record["messages"]
        assert messages[:2] == llm_user.session(tasks[record["task_id"]], 0).history
        lines = [m.content for m in traj.messages if m.role == "user"]
        heard = [m.content for i, m in enumerate(traj.messages[1:], 1)
                 if m.role == "assistant" and not m.tool_calls and traj.messages[i + 1:i + 2]
                 and traj.messages[i + 1].role == "user"]
        assert [m["content"] for m in messages[2:] if m["role"] == "assistant"][:-1] == lines[:-1]
        assert [m["content"] for m in messages[3:] if m["role"] == "user"] == heard
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * (len(lines))
        assert parse_stop(messages[-1]["content"])[1] == "stop", messages[-1]
    # an LLM user's last line reaches the transcript without its marker (parse_stop): the record puts it back
    traj = next(iter(episodes.values()))
    said = traj.model_copy(deep=True)
    said.messages[-1].content = parse_stop(said.messages[-1].content)[0]
    assert "###" not in said.messages[-1].content
    last = user_messages(tasks[traj.task_id], said)[-1]["content"]
    assert parse_stop(last) == (said.messages[-1].content, "stop")
    model, tokenizer = load("smollm2", device="cpu")
    server, chat = Generator(model, tokenizer, "user"), ChatFormat(tokenizer, [])
    for record in records[:5]:
        example = tokenize_conversation(chat, from_chat_record(record))
        starts = [i for i in range(len(example.mask)) if example.mask[i] and not example.mask[i - 1]]
        targets = [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"]
        assert len(starts) == len(targets)
        for start, at in zip(starts, targets, strict=True):
            served = server.prompt_ids(GenRequest(messages=record["messages"][:at], max_tokens=8))
            assert example.ids[:start] == served


def test_side_user_refuses_a_domain_whose_users_act_on_a_device(tmp_path: Path) -> None:
    """Telecom's users call device tools that the agent's transcript does not hold: refused in one line, with
    no data set written, rather than teaching a user that never acts."""
    done = subprocess.run(["muarl", "synth", "--domain", "telecom", "--side", "user", "--out", "user-data"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "has user tools" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "user-data" / "sft.jsonl").exists()


def test_an_embedded_user_waits_on_its_server_instead_of_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user served for the run is busy, not flaky: its requests wait (the turn limit bounds the turn) and are
    not retried into its own queue; ``--user-http-timeout`` still wins, and a remote ``llm:URL#MODEL`` keeps
    its retries."""
    from muarl.factory import make_user
    from muarl.users import embedded

    monkeypatch.setitem(embedded._endpoints, "llm", "llm:http://127.0.0.1:9/v1#smollm2")
    monkeypatch.setitem(embedded._endpoints, "llm:some/dir", "llm:http://127.0.0.1:9/v1#user")
    for spec in ("llm", "llm:some/dir"):
        user = make_user(spec)
        assert user.endpoint.max_retries == 0 and user.endpoint.timeout == embedded.HTTP_TIMEOUT_S
        assert user.max_tokens == embedded.MAX_TOKENS
    assert make_user("llm", http_timeout=30).endpoint.timeout == 30
    assert make_user("llm:http://127.0.0.1:9/v1#m").endpoint.max_retries > 0


@pytest.mark.slow
def test_user_llm_model_dir_serves_that_checkpoint_for_the_run(tmp_path: Path) -> None:
    """``--user llm:MODEL_DIR`` serves a local checkpoint for the run (here SmolLM2's own directory, linked
    into the run's working directory and named relatively): its log in the run directory, the spec recorded as
    given, the server gone at the end. A directory that is not a model is refused in one line."""
    from muarl.models import smollm2_path

    (tmp_path / "my-user").symlink_to(smollm2_path(), target_is_directory=True)

    def run(user: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(["muarl", "eval", "--domain", DOMAIN, "--policy", "expert", "--user", user, "--k", "1",
                               "--limit", "1", "--max-turns", "2", "--out", out, "--quiet"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=900)

    done = run("llm:my-user", "run")
    assert done.returncode == 0, done.stderr[-3000:]
    served = re.search(r"user: my-user served at http://127\.0\.0\.1:(\d+)/v1", done.stderr)
    assert served, done.stderr[-2000:]
    assert (tmp_path / "run" / "user-server-my-user.log").is_file()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["user"] == "llm:my-user"
    results = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    assert results["episodes"] == 1 and results["user_fault_rate"] == 0.0, results
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(served.group(1))), timeout=2):
        pass
    bad = run("llm:no-such-dir", "bad")
    assert bad.returncode == 2 and "not a model directory" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
