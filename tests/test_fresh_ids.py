"""Fresh identifiers: renamed consistently inside a conversation, afresh per step, identically on resume."""

import json
import random
import re

from muarl.domain import get_domain
from muarl.policies.expert import ExpertPolicy
from muarl.synth import from_chat_record, synthesize
from muarl.train.fresh_ids import refresh_ids, step_rng
from muarl.train.sft import SFTConfig, load_records, step_examples
from muarl.users.scripted import ScriptedUser


def _record(tmp_path):
    synthesize([get_domain("retail-lite")], ExpertPolicy(), ScriptedUser(), tmp_path, families=["cancel_order"],
               progress=False)
    return json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])


def _ids(text):
    return re.findall(r"\d{4,}", text)


def test_every_identifier_is_renamed_one_to_one_and_the_conversation_stays_consistent(tmp_path):
    record = _record(tmp_path)
    fresh = refresh_ids(record, random.Random(0))
    before, after = json.dumps(record["messages"]), json.dumps(fresh["messages"])
    old, new = _ids(before), _ids(after)
    assert len(old) == len(new) > 3
    mapping = dict(zip(old, new, strict=True))
    # the same id is renamed the same way everywhere, two ids never become one, lengths are kept
    assert all(mapping[o] == n for o, n in zip(old, new, strict=True))
    assert len(set(mapping.values())) == len(mapping)
    assert all(len(o) == len(n) for o, n in mapping.items())
    assert sum(o != n for o, n in mapping.items()) >= len(mapping) - 1
    # everything but the identifiers is untouched: short numbers, the tool list, the words
    assert re.sub(r"\d{4,}", "#", before) == re.sub(r"\d{4,}", "#", after)
    assert fresh["tools"] == record["tools"] and record["messages"] != fresh["messages"]
    # the order id the user gives is the one the agent looks up and cancels
    messages = from_chat_record(fresh)
    order = re.search(r"#W\d+", messages[1].content).group(0)
    calls = [c for m in messages for c in m.tool_calls if "order_id" in c.arguments]
    assert calls and all(c.arguments["order_id"] == order for c in calls)
    assert order not in json.dumps(record["messages"])


def test_step_examples_rename_afresh_each_step_and_alike_for_a_resumed_run(tmp_path):
    from muarl.models import load

    _record(tmp_path)
    _, tokenizer = load("tiny")
    records = load_records([str(tmp_path / "sft.jsonl")], tokenizer)[:3]
    config = SFTConfig(fresh_ids=True, seed=5)
    first = step_examples(records, [0, 1], 7, config)
    assert [e.ids for e in first] == [e.ids for e in step_examples(records, [0, 1], 7, config)]
    assert [e.ids for e in first] != [e.ids for e in step_examples(records, [0, 1], 8, config)]
    assert [e.ids for e in first] != [r.example.ids for r in records[:2]]
    # the loss falls on the same kind of tokens: the agent's turns keep their places
    assert [sum(e.mask) > 0 for e in first] == [True, True]
    plain = step_examples(records, [0, 1], 7, SFTConfig(fresh_ids=False))
    assert [e.ids for e in plain] == [r.example.ids for r in records[:2]]
    assert step_rng(5, 7, 0).random() == step_rng(5, 7, 0).random() != step_rng(5, 7, 1).random()


def test_copy_diagnosis_splits_every_agent_token_into_digits_or_the_rest(tmp_path):
    import importlib.util
    from pathlib import Path

    from muarl.models import load

    spec = importlib.util.spec_from_file_location("copy_diagnosis", Path(__file__).parents[1] / "scripts" / "copy_diagnosis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    groups = module.token_losses("tiny", "retail-lite", "test", 2)
    _, tokenizer = load("tiny")
    synthesize([get_domain("retail-lite")], ExpertPolicy(), ScriptedUser(), tmp_path, split="test", progress=False)
    examples = load_records([str(tmp_path / "sft.jsonl")], tokenizer)[:2]
    targets = [e.example.ids[i] for e in examples for i in range(1, len(e.example)) if e.example.mask[i]]
    with_digits = sum(bool(re.search(r"\d", tokenizer.decode([t]))) for t in targets)
    assert len(groups["digits"]) == with_digits > 0
    assert len(groups["other"]) == len(targets) - with_digits
    assert all(v > 0 for v in groups["digits"] + groups["other"])
    assert len(groups["right"]) == len(groups["digits"]) and set(groups["right"]) <= {0.0, 1.0}
    record = json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])
    short = module.cut(record, 2)
    assert short["tools"] == [] and len(short["messages"]) < len(record["messages"])
    assert sum(bool(m.get("tool_calls")) for m in short["messages"]) == 2 and short["messages"][-1].get("tool_calls")


def test_train_sft_trains_on_the_renamed_conversations(tmp_path):
    from muarl.train.sft import train_sft

    _record(tmp_path)
    data = tmp_path / "two.jsonl"
    data.write_text("\n".join((tmp_path / "sft.jsonl").read_text().splitlines()[:2]) + "\n")

    def first_step(fresh: bool, out: str) -> dict:
        config = SFTConfig(data=[str(data)], out=str(tmp_path / out), epochs=1, batch_size=2, lr=1e-3, packing=False,
                           max_len=0, save_every=0, report_to="none", fresh_ids=fresh)
        return train_sft(config, progress=False)["metrics"][0]

    plain, fresh = first_step(False, "plain"), first_step(True, "fresh")
    # same model, same conversations, same seed: only the renamed identifiers can change the loss
    assert plain["loss"] != fresh["loss"]
    assert first_step(True, "again")["loss"] == fresh["loss"]


def test_argument_copies_counts_a_value_right_only_when_every_token_of_it_is_predicted(tmp_path):
    """A stand-in model that sees the answer (this test is about the bookkeeping, not about a model):
    reading the next token gets every value right; reading one token too early gets them all wrong."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from muarl.models import load

    spec = importlib.util.spec_from_file_location("copy_diagnosis", Path(__file__).parents[1] / "scripts" / "copy_diagnosis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _record(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()[:2]]
    _, tokenizer = load("tiny")

    class Reader(torch.nn.Module):
        def __init__(self, shift: int):
            super().__init__()
            self.shift = shift

        def forward(self, input_ids):
            ids = input_ids[0]
            target = torch.roll(ids, -self.shift)
            return SimpleNamespace(logits=torch.nn.functional.one_hot(target, len(tokenizer)).float()[None])

    right = module.argument_copies(Reader(1), tokenizer, records)
    wrong = module.argument_copies(Reader(0), tokenizer, records)
    calls = [c for r in records for m in r["messages"] for c in m.get("tool_calls") or []]
    assert sum(map(len, right.values())) == sum(len(module._values(c["function"]["arguments"])) for c in calls) > 4
    assert {"order_id", "reason"} <= set(right)
    assert all(all(v) for v in right.values()) and not any(any(v) for v in wrong.values())
