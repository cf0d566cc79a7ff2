"""The teacher that mistypes a lookup now and then and recovers, and the weight-0 turns that keep its
wrong call out of the loss (docs/base_model.md, "Failed lookups")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muarl.domain import get_domain
from muarl.factory import make_user
from muarl.models import load
from muarl.policies.expert import ExpertPolicy
from muarl.policies.script import mistype
from muarl.synth import synthesize, untrained_turns
from muarl.train.pretrain import STREAM_SEED, ConversationStream, PretrainConfig
from muarl.train.sft import load_records


def _play(tmp: Path, slip_rate: float) -> list[dict]:
    report = synthesize([get_domain("retail-lite")], ExpertPolicy(slip_rate=slip_rate), make_user("scripted"), tmp,
                        split="dev", progress=False)
    assert not report.rejected  # slipping and recovering still wins every task cleanly
    return [json.loads(line) for line in (tmp / "sft.jsonl").read_text().splitlines()]


def test_a_slip_is_a_failed_lookup_then_asking_again_then_the_right_lookup(tmp_path: Path) -> None:
    records = _play(tmp_path, 1.0)
    assert len(records) == len(get_domain("retail-lite").tasks("dev"))  # every dev task, won cleanly
    for record in records:
        messages = record["messages"]
        i, j = sorted(untrained_turns(record))  # one mistyped lookup and one mistyped proposal per conversation
        wrong = messages[i]["tool_calls"][0]["function"]
        assert wrong["name"].startswith("find_user_id_by_")
        assert messages[i + 1]["role"] == "tool" and messages[i + 1]["content"].startswith("Error")
        assert messages[i + 2]["role"] == "assistant" and "could not find an account" in messages[i + 2]["content"]
        assert messages[i + 3]["role"] == "user"
        right = next(m["tool_calls"][0]["function"] for m in messages[i + 4:] if m.get("tool_calls"))
        assert right["name"] == wrong["name"]
        bad, good = json.loads(wrong["arguments"]), json.loads(right["arguments"])
        assert bad.keys() == good.keys() and sum(bad[k] != good[k] for k in bad) == 1
        assert all(good[k] in messages[i + 3]["content"] or good[k] in json.dumps(messages[: i]) for k in good)
        # the mistyped proposal: the user answers, the right proposal follows, and only its yes leads to the write
        said, user, again, after = messages[j], messages[j + 1], messages[j + 2], messages[j + 3]
        assert user["role"] == "user" and again["role"] == "assistant" and after["role"] == "user"
        assert len(said["content"]) == len(again["content"])
        assert sum(a != b for a, b in zip(said["content"], again["content"], strict=True)) == 1
        assert "proceed" in again["content"] and messages[j + 4].get("tool_calls")


def test_no_slip_rate_no_slips_and_a_slip_turn_gets_no_loss(tmp_path: Path) -> None:
    assert not any(untrained_turns(r) for r in _play(tmp_path / "clean", 0.0))
    records = _play(tmp_path / "slips", 1.0)
    tokenizer = load("tiny")[1]
    loaded = load_records([str(tmp_path / "slips" / "sft.jsonl")], tokenizer)
    unmarked = [{**r, "messages": [{k: v for k, v in m.items() if k != "weight"} for m in r["messages"]]}
                for r in records]
    (tmp_path / "unmarked.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unmarked))
    plain = load_records([str(tmp_path / "unmarked.jsonl")], tokenizer)
    for marked, whole, record in zip(loaded, plain, records, strict=True):
        assert marked.example.ids == whole.example.ids  # same tokens: the wrong call stays as context
        dropped = [j for j, (a, b) in enumerate(zip(marked.example.mask, whole.example.mask, strict=True)) if a != b]
        assert dropped and all(whole.example.mask[j] == 1 and marked.example.mask[j] == 0 for j in dropped)
        i, k = sorted(untrained_turns(record))
        wrong = record["messages"][i]["tool_calls"][0]["function"]["arguments"]
        text = tokenizer.decode([marked.example.ids[j] for j in dropped])
        assert all(str(v) in text for v in json.loads(wrong).values())  # what lost its loss: the wrong call ...
        assert record["messages"][k]["content"] in text  # ... and the wrong proposal


def test_weights_other_than_0_or_1_or_off_the_assistant_are_refused() -> None:
    record = {"messages": [{"role": "user", "content": "hi", "weight": 0}]}
    with pytest.raises(ValueError, match="must be 0 or 1 on an assistant message"):
        untrained_turns(record)
    with pytest.raises(ValueError, match="got 0.5"):
        untrained_turns({"messages": [{"role": "assistant", "content": "x", "weight": 0.5}]})


def test_mistype_changes_exactly_one_character_of_the_same_kind() -> None:
    import random

    rng = random.Random(0)
    for value in ("12345", "harper.jensen5862@example.com", "Harper", "x"):
        for _ in range(20):
            new = mistype(value, rng)
            assert len(new) == len(value) and sum(a != b for a, b in zip(new, value, strict=True)) == 1
            (j,) = [j for j, (a, b) in enumerate(zip(new, value, strict=True)) if a != b]
            assert new[j].isdigit() == value[j].isdigit() and new[j].isupper() == value[j].isupper()


def test_the_stream_slips_at_its_rate_and_first_chunk_moves_it_to_other_databases(tmp_path: Path) -> None:
    clean = ConversationStream(PretrainConfig(chunk_tasks=40), tmp_path / "clean").records(0, 30)
    slips = ConversationStream(PretrainConfig(chunk_tasks=40, slip_rate=0.5), tmp_path / "slips").records(0, 30)
    assert [r["task_id"] for r in slips] == [r["task_id"] for r in clean]  # same database, same tasks
    slipped = sum(bool(untrained_turns(r)) for r in slips)
    assert not any(untrained_turns(r) for r in clean) and 5 <= slipped <= 25
    later = ConversationStream(PretrainConfig(chunk_tasks=40, first_chunk=7), tmp_path / "later")
    moved = later.records(0, 30)
    assert sorted(p.name for p in (tmp_path / "later").glob("chunk_*")) == ["chunk_000007.jsonl"]
    # every conversation is with a user of chunk 7's database and none of chunk 0's (the two databases
    # share no user id: checked here, so a shared one cannot pass for a moved stream)
    users = {c: set(get_domain("retail-lite").with_database(seed=STREAM_SEED + c).database().tables["users"])
             for c in (0, 7)}
    assert not users[0] & users[7]
    assert {r["user_id"] for r in clean} <= users[0]
    assert {r["user_id"] for r in moved} <= users[7]


@pytest.mark.parametrize(("domain", "lookup"), [("retail", "find_user_id_by_"), ("airline", "get_user_details"),
                                              ("telecom", "get_customer_by_phone")])
def test_synth_slip_rate_writes_weight_0_turns_and_needs_the_expert(tmp_path: Path, capsys, domain: str,
                                                                    lookup: str) -> None:
    """``muarl synth --slip-rate``: the expert teacher slips in every domain, its identity lookup first (a
    mistyped lookup that finds nothing, then the right one on the same tool), and the data set keeps each
    slipped message with ``"weight": 0``; a teacher that cannot slip is refused in one line, before
    anything is written."""
    from muarl.cli import main

    out = tmp_path / "slips"
    assert main(["synth", "--domain", domain, "--slip-rate", "1", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    slipped = [line for line in lines if any(m.get("weight") == 0 for m in line["messages"])]
    assert len(slipped) == len(lines) > 0  # at rate 1 every kept conversation has a slip
    for line in lines:
        calls = [(i, c["function"]["name"], c["function"]["arguments"]) for i, m in enumerate(line["messages"])
                 for c in m.get("tool_calls") or []]
        (first, name, wrong), (_, again, right) = calls[0], calls[1]
        assert line["messages"][first].get("weight") == 0 and name.startswith(lookup) and again == name
        assert wrong != right and line["messages"][first + 1]["content"].startswith("Error")
    assert json.loads((out / "config.json").read_text())["slip_rate"] == 1
    capsys.readouterr()
    assert main(["synth", "--domain", domain, "--teacher", "noop", "--slip-rate", "0.5",
                 "--out", str(tmp_path / "noop")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "--slip-rate makes the expert teacher slip; the teacher is 'noop'" in err
    assert not (tmp_path / "noop").exists()
