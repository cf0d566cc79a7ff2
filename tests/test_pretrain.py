"""``muarl pretrain``: the stream never shows a held-out user, is deterministic, and a run resumes exactly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from muarl.domain import get_domain
from muarl.taskgen import user_split
from muarl.train.pretrain import ConversationStream, PretrainConfig

ROOT = Path(__file__).resolve().parents[1]
USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d{4}\b")


def test_the_stream_plays_train_users_only_and_never_a_test_user(tmp_path: Path) -> None:
    config = PretrainConfig(chunk_tasks=60)
    stream = ConversationStream(config, tmp_path / "stream")
    records = stream.records(0, 150)  # three chunks: three fresh databases
    test_users = {t.user_id for name in ("retail-lite", "retail") for t in get_domain(name).tasks("test")}
    played = {r["user_id"] for r in records}
    assert len(played) > 50
    assert all(user_split(u) == "train" for u in played)
    assert not played & test_users
    mentioned = {m for r in records for msg in r["messages"] for m in USER_ID.findall(msg.get("content") or "")}
    assert mentioned and not mentioned & test_users and all(user_split(u) == "train" for u in mentioned)
    # deterministic: a second stream (another process, another machine) yields the same records
    again = ConversationStream(config, tmp_path / "again").records(40, 70)
    assert again == records[40:110]


def _pretrain(out: Path, steps: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "muarl", "pretrain", "--out", str(out), "--steps", str(steps),
                           "--batch-size", "2", "--chunk-tasks", "20", "--probe-every", "2", "--save-every", "2",
                           "--hidden-size", "32", "--head-dim", "16", "--report-to", "none", "--no-progress"],
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_a_pretrain_run_stopped_and_resumed_equals_one_run(tmp_path: Path) -> None:
    whole = _pretrain(tmp_path / "whole", 4)
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert _pretrain(tmp_path / "parts", 2).returncode == 0
    resumed = _pretrain(tmp_path / "parts", 4)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def losses(out: Path) -> list[float]:
        return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    assert losses(tmp_path / "parts") == pytest.approx(losses(tmp_path / "whole"), rel=1e-6)
    probes = [json.loads(line) for line in (tmp_path / "parts" / "copy_probe.jsonl").read_text().splitlines()]
    assert [p["step"] for p in probes] == [2, 4] and all(0 <= p["copy_accuracy"] <= 1 for p in probes)
    assert (tmp_path / "whole" / "model" / "model.safetensors").read_bytes() == \
        (tmp_path / "parts" / "model" / "model.safetensors").read_bytes()


def test_a_misspelt_behaviour_is_an_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "muarl", "pretrain", "--out", str(tmp_path), "--exclude-behaviours",
                           "change_mind"], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"),
                                                                                  "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "unknown user behaviour change_mind" in done.stderr


def test_a_family_share_shortfall_is_said_once_not_per_chunk(tmp_path: Path) -> None:
    """Every chunk of the stream draws the same task mix, so a family that runs short (telecom's, at 600 tasks a
    database) is warned about once per domain, not once per chunk (thousands of lines in a long run)."""
    from muarl.taskgen import FamilyShareWarning

    stream = ConversationStream(PretrainConfig(domains=["telecom"], chunk_tasks=600), tmp_path / "stream")
    with pytest.warns(FamilyShareWarning) as caught:
        stream.chunk(0)
        stream.chunk(1)
    assert sum(issubclass(w.category, FamilyShareWarning) for w in caught) == 1


def test_the_stream_takes_users_in_turn_by_database(tmp_path: Path) -> None:
    """``--users scripted static``: even databases are played with the scripted user (who tells who they are
    when asked), odd ones with the static user (everything it knows in its opening message), so a base sees
    both kinds of opening."""
    stream = ConversationStream(PretrainConfig(users=["scripted", "static"], chunk_tasks=20), tmp_path / "stream")

    def introduced(record: dict) -> bool:  # the opening says who the user is
        opening = next(m["content"] for m in record["messages"] if m["role"] == "user")
        return "My name is" in opening or "My email is" in opening

    scripted, static = stream.chunk(0), stream.chunk(1)
    assert scripted and static
    assert all(map(introduced, static)), [r["messages"][:3] for r in static if not introduced(r)][:1]
    assert not any(map(introduced, scripted))
