"""Cold-start synthesis: clean teacher wins become a chat-format data set that `datasets` loads."""

import json
import subprocess
import sys
from pathlib import Path

from muarl.domain import get_domain
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import load_trajectories
from muarl.synth import from_chat_record, synthesize
from muarl.users.scripted import ScriptedUser

ROOT = Path(__file__).resolve().parents[1]


def test_synthesis_keeps_clean_wins_and_datasets_loads_them(tmp_path):
    import datasets

    domains = [get_domain("retail"), get_domain("telecom")]
    report = synthesize(domains, ExpertPolicy(), ScriptedUser(), tmp_path, exclude=["change_of_mind", "earbuds_blue"],
                        progress=False)
    lines = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(lines) == sum(report.kept.values()) > 300
    assert not {r["family"] for r in lines} & {"change_of_mind", "earbuds_blue"}
    assert {r["domain"] for r in lines} == {"retail", "telecom"}
    assert json.loads((tmp_path / "report.json").read_text())["kept_total"] == len(lines)

    data = datasets.load_dataset("json", data_files=str(tmp_path / "sft.jsonl"), split="train")
    assert len(data) == len(lines) and {"messages", "tools", "family"} <= set(data.column_names)

    # every kept line is exactly its recorded trajectory's conversation
    raw = {}
    for domain in domains:
        raw.update(load_trajectories(tmp_path / "trajectories" / f"{domain.name}.jsonl"))
    for record in lines[:50]:
        traj = raw[(record["task_id"], 0)]
        assert traj.reward.reward == 1.0 and not traj.reward.violations
        assert from_chat_record(record) == traj.messages


def test_unclean_teacher_episodes_are_rejected(tmp_path):
    report = synthesize([get_domain("airline")], ExpertPolicy(skip_confirmation=True), ScriptedUser(), tmp_path,
                        families=["change_of_mind", "cancel_eligible", "info_request"], progress=False,
                        min_kept=0.0)  # most are rejected, on purpose: keep what is clean
    assert report.rejected["violation"] + report.rejected["reward"] > 0
    kept = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    # only tasks without writes can be clean for a teacher that never asks for confirmation
    assert all(r["family"] == "info_request" for r in kept)


def test_synth_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "muarl", "synth", "--domain", "airline", "--families", "add_baggage",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "airline/add_baggage" in out.stdout and (tmp_path / "sft.jsonl").exists()
    bad = subprocess.run([sys.executable, "-m", "muarl", "synth", "--domain", "airline", "--families", "nope",
                          "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no task left" in bad.stderr
    typo = subprocess.run([sys.executable, "-m", "muarl", "synth", "--domain", "airline", "--exclude-behaviours",
                           "changes-mind", "--out", str(tmp_path / "y")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert typo.returncode == 2 and "unknown user behaviour changes-mind" in typo.stderr


def test_init_model_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "muarl", "init-model", "--out", str(tmp_path / "m"), "--hidden-size",
                          "32", "--layers", "1", "--head-dim", "24", "--kv-heads", "4", "--prompt", "compact"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    from muarl.models import load

    model, tokenizer = load(tmp_path / "m")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert model.config.head_dim == 24 and model.config.num_key_value_heads == 4
    assert model.model.layers[0].self_attn.q_proj.out_features == 4 * 24
    assert type(model).__name__ == "Qwen3ForCausalLM" and "<tool_call>" in tokenizer.get_vocab()
    system = [{"role": "system", "content": "the policy"}, {"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "find_order", "description": "d", "parameters": {}}}
    text = tokenizer.apply_chat_template(system, tools=[tool], tokenize=False)
    assert text.startswith("<|im_start|>system\ntools: find_order<|im_end|>") and "the policy" not in text
    again = subprocess.run([sys.executable, "-m", "muarl", "init-model", "--out", str(tmp_path / "m")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr
    uneven = subprocess.run([sys.executable, "-m", "muarl", "init-model", "--out", str(tmp_path / "u"), "--kv-heads", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert uneven.returncode != 0 and "multiple of --kv-heads 3" in uneven.stderr and not (tmp_path / "u").exists()


def test_prefixes_are_exact_openings_of_the_whole_conversations(tmp_path):
    """An opening keeps the system turn and tools and stops at the agent's Nth tool call, so SFT on it
    trains exactly the tokens it trains at the start of the whole conversation, under either template."""
    import pytest

    from muarl.chat import ChatFormat
    from muarl.models import load
    from muarl.synth import prefix_record, write_prefixes
    from muarl.tiny_model import chat_template
    from muarl.train.data import tokenize_conversation
    from muarl.types import ToolSpec

    synthesize([get_domain("retail-lite")], ExpertPolicy(), ScriptedUser(), tmp_path, progress=False)
    assert write_prefixes(tmp_path / "sft.jsonl", tmp_path / "open.jsonl", 2) > 20
    whole = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    opened = [json.loads(line) for line in (tmp_path / "open.jsonl").read_text().splitlines()]
    tokenizer = load("tiny")[1]
    for template in ("full", "compact"):
        tokenizer.chat_template = chat_template(template)
        for full, part in zip(whole[:10], opened[:10], strict=True):
            assert part["tools"] == full["tools"] and part["messages"][0] == full["messages"][0]
            assert sum(bool(m.get("tool_calls")) for m in part["messages"]) == 2 and part["messages"][-1]["tool_calls"]
            specs = [ToolSpec(name=t["function"]["name"], description=t["function"]["description"],
                              parameters=t["function"]["parameters"]) for t in full["tools"]]
            chat = ChatFormat(tokenizer, specs)
            a = tokenize_conversation(chat, from_chat_record(full))
            b = tokenize_conversation(chat, from_chat_record(part))
            assert a.ids[:len(b)] == b.ids and a.mask[:len(b)] == b.mask and len(b) < len(a)
            if template == "compact":
                assert len(b) < len(a) / 2
    short = {**whole[0], "messages": whole[0]["messages"][:4]}
    assert prefix_record(short, 9) == short
    with pytest.raises(ValueError, match="at least one tool call"):
        prefix_record(whole[0], 0)


def test_user_behaviours_are_read_from_the_scenario():
    from muarl.synth import user_behaviours

    retail, telecom = get_domain("retail").tasks("train"), get_domain("telecom").tasks("train")
    by_family = {}
    for task in retail + telecom:
        by_family.setdefault(task.family, []).append(user_behaviours(task))
    assert all("changes_mind" in b for b in by_family["change_of_mind"])
    assert all("withholds_info" in b for b in by_family["withheld_info"])
    assert all("out_of_policy" in b for b in by_family["out_of_policy"])
    assert all("acts_on_device" in b for b in by_family["airplane_mode"])
    assert not any("changes_mind" in b for b in by_family["cancel_order"])
    # retail users without an email in what they know must be found by name and zip
    for task in retail:
        assert ("no_email" in user_behaviours(task)) == ("email" not in task.scenario.known)
    assert all(f"trait:{t}" in user_behaviours(task) for task in telecom for t in task.scenario.traits)


def test_synthesis_leaves_out_the_user_behaviours_asked(tmp_path):
    import pytest

    from muarl.synth import user_behaviours

    domain = get_domain("retail")
    tasks = {t.id: t for t in domain.tasks("train")}
    report = synthesize([domain], ExpertPolicy(), ScriptedUser(), tmp_path, families=["cancel_order", "change_of_mind",
                        "withheld_info"], exclude_behaviours=["changes_mind", "no_email"], progress=False)
    kept = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert kept and not any(user_behaviours(tasks[r["task_id"]]) & {"changes_mind", "no_email"} for r in kept)
    assert {r["family"] for r in kept} == {"cancel_order", "withheld_info"}  # change_of_mind tasks all left out
    saved = json.loads((tmp_path / "report.json").read_text())["kept_behaviours"]
    assert "changes_mind" not in saved and saved["withholds_info"] == sum(r["family"] == "withheld_info" for r in kept)
    assert report.kept_behaviours == {k: v for k, v in saved.items()}
    # only users who withhold facts
    only = synthesize([domain], ExpertPolicy(), ScriptedUser(), tmp_path / "only", behaviours=["withholds_info"],
                      progress=False)
    assert set(only.kept) == {"retail/withheld_info"}
    # a misspelt behaviour is an error, not a filter that silently does nothing
    with pytest.raises(ValueError, match="unknown user behaviour chnges_mind; choose from"):
        synthesize([domain], ExpertPolicy(), ScriptedUser(), tmp_path / "bad", exclude_behaviours=["chnges_mind"],
                   progress=False)
