"""Draw user turns from evaluations for labelling, and score the slip checks against the labels.

    python scripts/slip_labels.py draw scripted=runs/slip-labels/eval-scripted:110 \\
        scripted=runs/slip-labels/eval-scripted-dev:80 smollm2=runs/slip-labels/eval-smollm2:500:500 \\
        smollm2=runs/slip-labels/eval-smollm2-expert:60 user-model=runs/slip-labels/eval-user-model:60
    python scripts/slip_labels.py score          # the precision/recall table of docs/conversations.md

``draw`` writes ``conversations.jsonl.gz`` (each conversation once, no system prompt, a failed call's output
cut to 200 characters) and ``turns.jsonl`` (the drawn turns, the checks' flags at drawing time, labels unset) into
``tests/data/slip_labels``; a person then labels each turn by the rules in its ``RULES.md``. Drawn
stratified per run: every flagged turn of each kind (at most ``--cap`` a kind), then unflagged turns
at random (seeded) up to the run's quota.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path
from typing import Any

from muarl.rollout import load_trajectories
from muarl.users.slip_labels import LABELS, agent_error_score, flags_now, fmt, load, scores, table
from muarl.users.slips import AGENT_ERROR, SLIPS, episode_slips

DOC = Path(__file__).resolve().parents[1] / "docs" / "conversations.md"
START, END = "<!-- slip-labels:start -->", "<!-- slip-labels:end -->"


def _conversation(source: str, config: dict[str, Any], traj: Any, trial: int) -> dict[str, Any]:
    """One trajectory as the labelled set keeps it: enough to read and to check again, small."""
    messages = []
    for m in traj.messages:
        content = "" if m.role == "system" else m.content
        if m.role == "tool" and content.startswith("Error"):
            content = content[:200]  # a failed call's long hint (the tool list) says nothing the checks read
        messages.append({"role": m.role, "content": content, "tool_call_id": m.tool_call_id,
                         "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]})
    return {"id": f"{source}/{traj.task_id}/{trial}", "source": source, "domain": config["domain"],
            "split": config.get("split", "test"), "policy": config.get("policy"), "user": config.get("user"),
            "task_id": traj.task_id, "trial": trial,
            "stop_reason": traj.stop_reason, "observed": [r.output for r in traj.tool_log if r.actor == "user"],
            "messages": messages}


def _turn(conv: dict[str, Any], n: int, flags: set[str]) -> dict[str, Any]:
    """One drawn turn: where it is, the agent's words before it (the last 400 characters) and the user's
    message before (the first 300), the turn, the flags at drawing time; the scenario by domain and task id."""
    msgs = conv["messages"]
    last_user = max((j for j in range(n) if msgs[j]["role"] == "user"), default=None)
    agent = "\n".join(m["content"] for m in msgs[(last_user or 0) + 1:n] if m["role"] == "assistant" and m["content"])
    return {"id": f"{conv['id']}#{n}", "conversation": conv["id"], "index": n, "source": conv["source"],
            "domain": conv["domain"], "task_id": conv["task_id"], "agent": _cut(agent, -400),
            "previous_user": None if last_user is None else _cut(msgs[last_user]["content"], 300),
            "user": msgs[n]["content"], "last": n == len(msgs) - 1, "flags": sorted(flags),
            "labels": None, "agent_error": None, "note": ""}


def _cut(text: str, n: int) -> str:
    """The first ``n`` characters of ``text`` (the last ones for a negative ``n``), marked where cut."""
    if len(text) <= abs(n):
        return text
    return f"{text[:n]}..." if n > 0 else f"...{text[n:]}"


def draw(sources: list[tuple[str, Path, int, int]], seed: int, out: Path) -> None:
    from muarl.domain import get_domain

    conversations, turns = [], []
    for source, run, quota, cap in sources:
        rng = random.Random(seed)  # each run's draw its own: adding a run leaves the others' draws as they were
        config = json.loads((run / "config.json").read_text())
        domain = get_domain(config["domain"])
        tasks = {t.id: t for split in ("train", "dev", "test") for t in domain.tasks(split)}
        candidates = []
        for (_, trial), traj in load_trajectories(run / "trajectories.jsonl").items():
            if traj.fault_kind:
                continue
            conv = _conversation(source, config, traj, trial)
            conversations.append(conv)
            slips = episode_slips(domain, tasks[traj.task_id], traj)
            for n, m in enumerate(traj.messages):
                if m.role == "user":
                    flags = {k for k, where in slips.items() if n in where}
                    candidates.append(_turn(conv, n, flags))
        rng.shuffle(candidates)
        chosen: list[dict[str, Any]] = []
        for kind in SLIPS:
            chosen += [t for t in candidates if kind in t["flags"] and t not in chosen][:cap]
        rest = [t for t in candidates if not t["flags"]]
        chosen += rest[:max(0, quota - len(chosen))]
        turns += sorted(chosen, key=lambda t: (t["conversation"], t["index"]))
    used = {t["conversation"] for t in turns}
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "conversations.jsonl.gz", "wt") as f:  # 0.7 MB as text: compressed, the set stays small
        f.writelines(json.dumps(c) + "\n" for c in conversations if c["id"] in used)
    (out / "turns.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    print(f"drew {len(turns)} turns from {len(used)} conversations into {out}")


def label(root: Path, tsv: Path) -> None:
    """Write a labeller's verdicts into ``turns.jsonl``: one line a turn, ``ID<TAB>KINDS<TAB>AGENT_ERROR<TAB>NOTE``
    (KINDS: the kinds the turn shows, comma-separated, empty for none; AGENT_ERROR: 1 or 0)."""
    verdicts = {}
    for line in tsv.read_text().splitlines():
        if line.strip():
            tid, kinds, agent_error, note = [*line.split("\t"), "", "", ""][:4]
            unknown = {k for k in kinds.split(",") if k} - set(SLIPS)
            if unknown:
                raise SystemExit(f"{tid}: unknown kinds {sorted(unknown)}")
            verdicts[tid] = ({k for k in kinds.split(",") if k}, int(agent_error or 0), note.strip())
    _, turns = load(root)
    for t in turns:
        if t["id"] in verdicts:
            kinds, t["agent_error"], t["note"] = verdicts[t["id"]]
            t["labels"] = {k: int(k in kinds) for k in SLIPS}
    (root / "turns.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    print(f"{sum(t['labels'] is not None for t in turns)} of {len(turns)} turns labelled")


def score(root: Path, candidate_below: float, write: bool) -> None:
    """The table, for the flags stored at drawing time and for the current checks; ``write``: also
    ``scores.json`` (the figures docs/conversations.md states and its test holds the checks to)."""
    conversations, turns = load(root)
    labelled = [t for t in turns if t["labels"] is not None]
    now = flags_now(conversations, labelled)
    before = scores(labelled, [set(t["flags"]) for t in labelled])
    after = scores(labelled, now)
    cands = sorted(k for k, s in after.items() if s.precision is None or s.precision < candidate_below)
    print(f"{len(labelled)} labelled turns, by source: "
          f"{ {s: sum(t['source'] == s for t in labelled) for s in sorted({t['source'] for t in labelled})} }")
    print("flags at drawing time:\n" + table(before, ()))
    print("current checks:\n" + table(after, cands))
    agent = agent_error_score(labelled, now)
    p, r = agent.intervals()
    print(f"{AGENT_ERROR} over the flagged turns: {agent.tp} right, {agent.fp} wrong, {agent.fn} missed; "
          f"precision {fmt(agent.precision, p)}, recall {fmt(agent.recall, r)}")
    if write:
        figures = {k: {"tp": s.tp, "fp": s.fp, "fn": s.fn, "precision": s.precision, "recall": s.recall}
                   for k, s in after.items()}
        figures[AGENT_ERROR] = {"tp": agent.tp, "fp": agent.fp, "fn": agent.fn, "precision": agent.precision,
                                "recall": agent.recall}
        (root / "scores.json").write_text(json.dumps({"turns": len(labelled), "candidate_below": candidate_below,
                                                      "candidates": cands, "kinds": figures}, indent=1) + "\n")
        _write_doc(table(after, cands))


def _write_doc(rows: str) -> None:
    """Put the current table between docs/conversations.md's markers (the figures its test reads back)."""
    text = DOC.read_text()
    start, end = text.index(START) + len(START), text.index(END)
    DOC.write_text(f"{text[:start]}\n{rows}\n{text[end:]}")


def _source(spec: str, quota: int, cap: int) -> tuple[str, Path, int, int]:
    name, _, run = spec.partition("=")
    path, *limits = run.split(":")
    return name, Path(path), int(limits[0]) if limits else quota, int(limits[1]) if len(limits) > 1 else cap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("draw", help="draw turns for labelling")
    d.add_argument("sources", nargs="+", help="SOURCE=RUN_DIR[:QUOTA[:CAP]] (an evaluation's run directory, the "
                                                "most turns drawn from it and flagged turns a kind: --quota, --cap)")
    d.add_argument("--quota", type=int, default=110, help="turns per run directory")
    d.add_argument("--cap", type=int, default=25, help="flagged turns per kind and source")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, default=LABELS)
    la = sub.add_parser("label", help="write a labeller's verdicts (a TSV) into turns.jsonl")
    la.add_argument("tsv", type=Path)
    la.add_argument("--root", type=Path, default=LABELS)
    s = sub.add_parser("score", help="the checks against the labels")
    s.add_argument("--root", type=Path, default=LABELS)
    s.add_argument("--candidate-below", type=float, default=0.9, help="precision under which a kind is a candidate")
    s.add_argument("--write", action="store_true", help="also write ROOT/scores.json")
    args = parser.parse_args()
    if args.command == "draw":
        draw([_source(s, args.quota, args.cap) for s in args.sources], args.seed, args.out)
    elif args.command == "label":
        label(args.root, args.tsv)
    else:
        score(args.root, args.candidate_below, args.write)


if __name__ == "__main__":
    main()
