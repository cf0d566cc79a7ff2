"""The run viewer's data extraction, compaction and CLI, on real run directories (see viewer_runs.py)."""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import viewer_runs
from muarl.report import data as rd
from muarl.report.html import build_report, charts, encode_blob, payload
from muarl.report.plots import nice_ticks
from muarl.report.tokens import PrefixTable, expand_runs, find_tokenizer, run_lengths, vocab
from muarl.types import Trajectory

eval_run, training_run, telecom_run = viewer_runs.eval_run, viewer_runs.training_run, viewer_runs.telecom_run


def _trajs(path: Path) -> list[Trajectory]:
    return [Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def _blob(html: str) -> dict:
    match = re.search(r'<script id="muarl-data" type="application/json" data-encoding="([^"]+)">(.*?)</script>',
                      html, re.S)
    assert match, "no data script in the page"
    encoding, text = match.groups()
    if encoding == "gzip+base64":
        return json.loads(gzip.decompress(base64.b64decode(text)))
    return json.loads(text)


# ---------- lanes ----------

def test_lanes_put_every_message_and_call_in_its_lane_in_order(eval_run):
    for traj in _trajs(eval_run / "trajectories.jsonl"):
        events = rd.lanes(traj)
        agent_text = [e["text"] for e in events if e["lane"] == "agent" and e["kind"] == "message"]
        said = [m.content for m in traj.messages if m.role == "assistant" and (m.content.strip() or not m.tool_calls)]
        assert agent_text == said
        assert [e["text"] for e in events if e["lane"] == "user" and e["kind"] == "message"] == \
            [m.content for m in traj.messages if m.role == "user"]
        calls = [e["name"] for e in events if e["lane"] == "agent" and e["kind"] == "call"]
        assert calls == [r.name for r in traj.tool_log if r.actor == "agent"]
        results = [(e["name"], e["text"], e["ok"]) for e in events if e["lane"] == "tools"]
        assert results == [(r.name, r.output, r.ok) for r in traj.tool_log]
        # each tool result comes right after the call that caused it (several calls: in call order)
        order = [(e["lane"], e["kind"]) for e in events]
        for n, (lane, _) in enumerate(order):
            if lane == "tools":
                assert order[n - 1] in (("agent", "call"), ("tools", "result"))


def test_user_phone_actions_sit_before_the_user_message_they_precede(telecom_run):
    trajs = _trajs(telecom_run / "trajectories.jsonl")
    assert any(r.actor == "user" for t in trajs for r in t.tool_log), "fixture needs user tool calls"
    for traj in trajs:
        events = rd.lanes(traj)
        user_messages = 0
        for e in events:
            if e["lane"] == "user" and e["kind"] == "message":
                user_messages += 1
            if e["lane"] == "user" and e["kind"] == "call":
                turn = int(re.match(r"user_t(\d+)_", e["id"]).group(1))
                assert user_messages == turn  # after user message turn-1, before user message turn
        assert sum(e["kind"] == "call" and e["lane"] == "user" for e in events) == \
            sum(r.actor == "user" for r in traj.tool_log)


def test_a_malformed_call_shows_as_an_error_in_the_tools_lane():
    # the shape run_episode records for a tool call that could not be parsed (no execution, no record)
    traj = Trajectory(task_id="t", domain="retail", messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<tool_call>{bad json</tool_call>"},
        {"role": "tool", "name": "error", "content": "Error: malformed tool call: bad JSON"}])
    events = rd.lanes(traj)
    assert events[-1] == {"lane": "tools", "kind": "error", "name": "error", "ok": False,
                          "text": "Error: malformed tool call: bad JSON"}


# ---------- scoring, groups, overview ----------

def test_unscored_trajectories_are_scored_with_the_same_diff_as_the_engine(eval_run):
    trajs = _trajs(eval_run / "trajectories.jsonl")
    failed = [t for t in trajs if t.reward.reward < 1]
    assert failed and any(t.reward.diff for t in failed), "fixture needs a failed episode with a diff"
    index, warnings = rd.TaskIndex(), []
    for t in trajs:
        original = t.reward
        entry = rd.Entry(t.model_copy(update={"reward": None}), "x", None)
        rd.ensure_scored(entry, index, warnings)
        assert entry.scored_here and entry.traj.reward == original
    unknown = rd.Entry(Trajectory(task_id="nope", domain="retail"), "x", None)
    rd.ensure_scored(unknown, index, warnings)
    assert unknown.traj.reward is None and "nope" in warnings[-1]


def test_groups_use_recorded_advantages_and_compute_missing_ones(training_run):
    run = rd.load_run(training_run)
    groups = rd.groups(run.entries)
    assert len(groups) == 5  # 2 + 2 tiny-model groups, 1 expert vs expert-noconfirm group
    for g in groups:
        assert g["advantage_source"] == "recorded"
        assert g["advantages"] == [run.entries[i].traj.metadata["advantage"] for i in g["members"]]
        assert [run.entries[i].traj.metadata["member"] for i in g["members"]] == list(range(len(g["members"])))
    mixed = next(g for g in groups if g["step"] == 3)
    assert mixed["rewards"] == [1.0, 0.0]
    # without recorded advantages: GRPO's (r - mean) / (sample std + 1e-6) = +-0.5 / 0.70711
    for i in mixed["members"]:
        run.entries[i].traj.metadata.pop("advantage")
    computed = next(g for g in rd.groups(run.entries) if g["step"] == 3)
    assert computed["advantage_source"] == "computed (GRPO)"
    assert computed["advantages"] == pytest.approx([0.70710, -0.70710], abs=1e-4)


def test_overview_counts_what_the_run_holds(eval_run):
    run = rd.load_run(eval_run)
    ov = rd.overview(run)
    trajs = _trajs(eval_run / "trajectories.jsonl")
    assert ov["trajectories"] == len(trajs) == 8
    assert ov["tasks"] == 4
    assert ov["success"] == pytest.approx(sum(t.reward.reward for t in trajs) / len(trajs), abs=1e-4)
    assert sum(ov["stop_reasons"].values()) == len(trajs)
    assert run.results is not None and run.files[:2] == ["config.json", "results.json"]


# ---------- reading run directories ----------

def test_torn_and_bad_lines_become_warnings_and_the_file_is_left_untouched(eval_run, tmp_path):
    lines = (eval_run / "trajectories.jsonl").read_text().splitlines()
    text = lines[0] + "\n" + "{not json\n" + "\n".join(lines[1:4]) + "\n" + lines[4][: len(lines[4]) // 2]
    (tmp_path / "trajectories.jsonl").write_text(text)
    run = rd.load_run(tmp_path)
    assert len(run.entries) == 4
    assert any("line 2" in w for w in run.warnings)
    assert any("torn" in w for w in run.warnings)
    assert (tmp_path / "trajectories.jsonl").read_text() == text  # a viewer never repairs a run


def test_a_record_that_is_not_a_trajectory_is_named(tmp_path):
    (tmp_path / "trajectories.jsonl").write_text(json.dumps({"task_id": "a", "domain": "retail", "turns": "x"}) + "\n")
    run = rd.load_run(tmp_path)
    assert run.entries == [] and "line 1 is not a trajectory" in run.warnings[0]


def test_missing_and_empty_directories_are_clear_errors(tmp_path):
    with pytest.raises(rd.EmptyRunError, match="does not exist"):
        rd.load_run(tmp_path / "nope")
    with pytest.raises(rd.EmptyRunError, match="holds no run files"):
        rd.load_run(tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(rd.EmptyRunError, match="not a directory"):
        rd.load_run(tmp_path / "f.txt")


def test_view_cli_prints_the_path_and_fails_clearly(eval_run, tmp_path):
    out = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-m", "muarl", "view", str(eval_run), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out.resolve())
    assert _blob(out.read_text())["overview"]["trajectories"] == 8
    bad = subprocess.run([sys.executable, "-m", "muarl", "view", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_max_trajectories_keeps_the_first_and_last_halves(training_run):
    everything = rd.load_run(training_run).entries
    run = rd.load_run(training_run, max_trajectories=5)
    assert run.omitted == len(everything) - 5
    ids = [(e.source, e.traj.task_id, e.traj.metadata["member"]) for e in run.entries]
    full = [(e.source, e.traj.task_id, e.traj.metadata["member"]) for e in everything]
    assert ids == full[:3] + full[-2:]
    assert "left out" in run.warnings[-1]


# ---------- tokens ----------

def test_run_lengths_round_trip_real_loss_masks(training_run):
    run = rd.load_run(training_run)
    masks = [e.traj.loss_mask for e in run.entries if e.traj.loss_mask]
    assert masks
    for mask in masks:
        runs = run_lengths(mask)
        assert expand_runs(runs) == mask
        assert sum(runs[1::2]) == sum(mask)
    assert run_lengths([1, 1, 0]) == [0, 2, 1] and run_lengths([]) == [0]


def test_prefix_table_stores_the_shared_system_turn_once_and_rebuilds_every_sequence(training_run):
    run = rd.load_run(training_run)
    seqs = [e.traj.token_ids for e in run.entries if e.traj.token_ids]
    table = PrefixTable({"retail": seqs})
    prefix = table.prefixes[0]
    assert all(s[: len(prefix)] == prefix for s in seqs)
    assert len({s[len(prefix)] for s in seqs if len(s) > len(prefix)}) > 1  # longest: the next token differs
    for e in run.entries:
        if e.traj.token_ids:
            enc = table.encode("retail", e.traj.token_ids, e.traj.loss_mask, e.traj.logprobs)
            assert prefix + enc["ids"] == e.traj.token_ids
            assert enc["logprobs"] == [round(v, 3) for v, m in zip(e.traj.logprobs, e.traj.loss_mask, strict=True) if m]


def test_tokenizer_is_found_in_the_run_and_decodes_the_agent_spans(training_run, tmp_path):
    tok, where = find_tokenizer(training_run)
    assert where == str(training_run / "model")
    (tmp_path / "config.json").write_text(json.dumps({"model": "tiny"}))
    assert find_tokenizer(tmp_path)[1] == "tiny"
    assert find_tokenizer(tmp_path / "nothing-here") == (None, "")
    run = rd.load_run(training_run)
    traj = next(e.traj for e in run.entries if e.traj.token_ids)
    pieces = vocab(tok, traj.token_ids)
    spans, current = [], []
    for t, m in zip(traj.token_ids, traj.loss_mask, strict=True):
        if m:
            current.append(t)
        elif current:
            spans.append(current)
            current = []
    spans += [current] if current else []
    for span in spans:
        assert "".join(pieces[str(t)] for t in span) == tok.decode(span, skip_special_tokens=False)


# ---------- the page ----------

def test_payload_carries_lanes_rewards_tasks_and_compact_tokens(training_run):
    run = rd.load_run(training_run)
    tok, name = find_tokenizer(training_run)
    blob = payload(run, tok, name)
    assert len(blob["trajectories"]) == len(run.entries)
    t0 = blob["trajectories"][0]
    assert t0["events"] == rd.lanes(run.entries[0].traj)
    assert t0["reward"]["diff"] == run.entries[0].traj.reward.diff
    assert blob["tasks"][f"retail/{t0['task_id']}"]["gold"]
    assert len(blob["strings"]) == 1  # one policy text for every retail episode
    used = {i for t in blob["trajectories"] if t["tokens"] for i in t["tokens"]["ids"]} | set(blob["prefixes"][0])
    assert set(map(int, blob["vocab"])) == used


def test_big_runs_stay_small_and_compressed_blobs_round_trip(eval_run, tmp_path):
    lines = (eval_run / "trajectories.jsonl").read_text().splitlines()
    big = tmp_path / "big"
    big.mkdir()
    with (big / "trajectories.jsonl").open("w") as f:  # 2,000 real trajectories (the 8 repeated)
        for n in range(2000):
            traj = json.loads(lines[n % len(lines)])
            traj["metadata"]["member"] = n
            f.write(json.dumps(traj) + "\n")
    path = build_report(big)
    size, source = path.stat().st_size, (big / "trajectories.jsonl").stat().st_size
    assert size < source / 4, (size, source)
    blob = _blob(path.read_text())
    assert len(blob["trajectories"]) == 2000
    encoding, text = encode_blob(blob, "never")
    assert encoding == "json" and json.loads(text) == blob


def test_page_text_cannot_close_the_data_script(eval_run, tmp_path):
    traj = _trajs(eval_run / "trajectories.jsonl")[0]
    traj.messages[1].content = "</script><script>alert(1)</script>"
    (tmp_path / "trajectories.jsonl").write_text(traj.model_dump_json() + "\n")
    html = build_report(tmp_path, compress="never").read_text()
    data = html.split('data-encoding="json">', 1)[1]
    assert data.index("</script>") > data.index("alert(1)")  # the first </script> is the blob's own end
    assert _blob(html)["trajectories"][0]["events"][0]["text"] == "</script><script>alert(1)</script>"


def test_curves_chart_every_metric_with_one_point_per_step(training_run):
    metrics = [json.loads(line) for line in (training_run / "metrics.jsonl").read_text().splitlines()]
    metrics[0]["my_metric"] = 1.5
    svgs = charts(metrics)
    titles = [re.search(r'aria-label="([^"]+)"', s).group(1) for s in svgs]
    assert titles[0] == "reward" and "my_metric" in titles
    reward = svgs[0]
    assert reward.count("<circle") == len(metrics)
    assert len(re.search(r'points="([^"]+)"', reward).group(1).split()) == len(metrics)
    assert f"reward @ 3: {metrics[2]['reward']:g}" in reward


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0, 1) == [0, 0.25, 0.5, 0.75, 1]
    assert nice_ticks(0, 7) == [0, 2, 4, 6, 8]
    assert nice_ticks(3, 3) == [3]
    ticks = nice_ticks(0.013, 0.29, 4)
    assert ticks[0] <= 0.013 and ticks[-1] >= 0.29


def test_evaluation_tables_show_every_metric_and_task(eval_run):
    html = build_report(eval_run).read_text()
    results = json.loads((eval_run / "results.json").read_text())
    section = html.split('id="sec-evaluation"', 1)[1].split("</section>", 1)[0]
    assert 'data-tab="training"' not in html  # an evaluation has a config.json but no curves
    for key, value in results["metrics"].items():
        if isinstance(value, dict):  # tool-call mix and stop reasons get tables of their own
            assert f"<h3>{key.replace('_', ' ')}</h3>" in section
            assert all(f"<th>{inner}</th>" in section for inner in value)
        else:
            assert f"<th>{key}</th>" in section
    for row in results["tasks"]:
        assert f"<td>{row['task_id']}</td>" in section


@pytest.mark.slow
def test_a_real_grpo_run_shows_its_step_groups_curves_and_tokens(tmp_path):
    """What ``muarl grpo`` itself writes (rollouts/step_*.jsonl, metrics.jsonl, model/) is read as is."""
    from muarl.train.grpo import train_grpo
    from muarl.train.grpo_config import preset

    out = tmp_path / "grpo"
    train_grpo(preset("tiny", out=str(out), steps=1, tasks_per_step=2, group_size=2, max_new_tokens=12,
                      max_turns=2), progress=False)
    step_file = out / "rollouts" / "step_000001.jsonl"
    written = _trajs(step_file)
    blob = _blob(build_report(out).read_text())
    assert blob["tokenizer"] == str(out / "model") and blob["vocab"]
    assert len(blob["groups"]) == 2
    for g in blob["groups"]:
        assert g["advantage_source"] == "recorded" and g["step"] == 1
        members = [written[i] for i in g["members"]]
        assert {m.task_id for m in members} == {g["task_id"]}
        assert g["advantages"] == [m.metadata["advantage"] for m in members]
    shown = blob["trajectories"]
    assert [t["meta"]["trained"] for t in shown] == [t.metadata["trained"] for t in written]
    assert [sum(t["tokens"]["mask"][1::2]) for t in shown] == [sum(t.loss_mask) for t in written]
    html = build_report(out).read_text()
    assert 'data-tab="training">training (1 steps)' in html
    for title in ("reward", "KL to reference (k3)", "entropy", "loss", "grad norm"):
        assert f'aria-label="{title}"' in html
