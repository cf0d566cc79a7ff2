"""The self-contained HTML report: static sections rendered here, trajectories by a small inline script.

Why this split: curves and evaluation tables are small and final, so they are plain HTML and SVG; the
trajectories can number in the thousands, so they travel as one JSON blob (gzip + base64 once it is
big; the browser inflates it with DecompressionStream) that vanilla JavaScript pages through and draws
on demand, the token overlay only when asked for. Nothing is fetched: CSS and JS are inlined.
"""

from __future__ import annotations

import base64
import gzip
import json
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from muarl.files import atomic_write
from muarl.report import data as rd
from muarl.report.plots import fmt, line_chart, stacked_bars
from muarl.report.tokens import PrefixTable, find_tokenizer, vocab
from muarl.time_split import step_seconds
from muarl.users.slips import SLIPS

COMPRESS_ABOVE = 256 * 1024  # bytes of JSON; smaller blobs stay readable in the page source
# the paper's training dynamics first, in the order the paper discusses them; any other numeric
# metric gets a chart of its own after these
# (a panel's keys may be a prefix instead: every metric that starts with it, in the order they were logged)
#: the stacked bar of a step's wall time by where it went (muarl.time_split.step_seconds)
STEP_TIME = "where a step's seconds went"
PANELS: list[tuple[str, list[str] | str]] = [
    ("reward", ["reward"]),
    ("groups all correct / all wrong", ["all_correct_groups", "all_wrong_groups"]),
    ("turns per episode", ["turns"]),
    ("response tokens per episode", ["response_tokens"]),
    ("general tool calls per episode", "calls_"),  # the domain's general tools (Domain.general_tools)
    ("KL to reference (k3)", ["kl"]),
    ("entropy", ["entropy"]),
    ("loss", ["loss"]),
    ("grad norm", ["grad_norm"]),
    ("clip fraction", ["clip_fraction"]),
    ("faults / violations per episode", ["sim_fault_rate", "fault_rate", "violation_rate", "truncation_rate",
                                           "malformed_calls"]),
    ("the simulated user's slips per episode", ["user_slip_rate", *(f"user_{k}_rate" for k in SLIPS)]),
    ("seconds per step", ["rollout_s", "reference_s", "update_s"]),
    (STEP_TIME, []),  # a stacked bar, not curves (muarl.time_split.step_seconds)
    # asynchronous GRPO (--max-staleness): how old the trained groups were, what was dropped, who waited
    ("staleness (updates)", ["staleness_mean", "staleness_max"]),
    ("idle seconds per step", ["trainer_idle_s", "sampler_idle_s"]),
    ("dropped groups", ["dropped_groups"]),
    ("tokens per second", ["tokens_per_s", "policy_tokens_per_s", "user_tokens_per_s"]),
    # muarl.time_split: the share of the rollouts' wall time in which some episode waited on each party
    ("busy share of the rollouts' wall time", ["split_policy_busy", "split_user_busy", "split_tools_busy",
                                               "split_grading_busy"]),
    ("learning rate", ["lr"]),
]
SKIP_CURVES = {"step", "epoch"}
#: what a training run's page opens on, before its settings: is it learning, are its groups informative,
#: is it behaving, how long a step takes (an SFT run: its loss)
HEADLINE = ("reward", "groups all correct / all wrong", "faults / violations per episode", "loss", "seconds per step",
            STEP_TIME)


def charts(metrics: list[dict[str, Any]], only: tuple[str, ...] | None = None) -> list[str]:
    """SVG charts of every numeric metric over steps (known panels first); ``only``: just those panels (by
    title; a GRPO run shows the loss among its other curves, an SFT run has little else)."""
    if not metrics:
        return []
    if only is not None:
        panels = [(title, keys) for title, keys in PANELS if title in only]
        if "reward" in {k for m in metrics for k in m}:
            panels = [(title, keys) for title, keys in panels if title != "loss"]
        return _charts(metrics, panels, rest=False)
    return _charts(metrics, PANELS, rest=True)


def _charts(metrics: list[dict[str, Any]], panels: list[tuple[str, list[str] | str]], rest: bool) -> list[str]:
    x = [float(m.get("step", n + 1)) for n, m in enumerate(metrics)]
    numeric = [k for k in dict.fromkeys(k for m in metrics for k in m)
               if k not in SKIP_CURVES and any(_is_num(m.get(k)) for m in metrics)]
    out, used = [], set()
    split = [step_seconds(m) for m in metrics]
    if any(split):  # the split's own keys are drawn as its stacked bar and the busy panel, not one by one
        used.update(k for k in numeric if k.startswith("split_"))
    for title, keys in panels:
        if title == STEP_TIME and any(split):
            names = list(dict.fromkeys(k for row in split for k in row))
            out.append(stacked_bars(STEP_TIME, x, {k: [row.get(k) for row in split] for k in names}))
            continue
        present = ([k for k in numeric if k.startswith(keys)] if isinstance(keys, str)
                   else [k for k in keys if k in numeric])
        if present:
            used.update(present)
            out.append(line_chart(title, x, {k: [_num(m.get(k)) for m in metrics] for k in present}))
    for key in numeric if rest else []:
        if key not in used:
            out.append(line_chart(key, x, {key: [_num(m.get(key)) for m in metrics]}))
    return out


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _num(v: Any) -> float | None:
    return float(v) if _is_num(v) else None


def _cell(v: Any) -> str:
    if _is_num(v):
        return escape(fmt(float(v)) if isinstance(v, float) else str(v))
    if isinstance(v, dict):
        return escape(", ".join(f"{k}: {_cell(x)}" for k, x in v.items()))
    if isinstance(v, list):
        return escape(", ".join(str(x) for x in v))
    return escape("" if v is None else str(v))


def key_value_table(data: dict[str, Any], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in data.items())
    return f'<table class="{cls}">{rows}</table>'


def rows_table(rows: list[dict[str, Any]], cls: str = "grid") -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def eval_section(results: dict[str, Any]) -> str:
    """results.json of ``muarl eval``: headline metrics, one table per nested metric (tool-call mix, stop
    reasons ...), the per-task table."""
    metrics = dict(results.get("metrics") or {})
    parts = []
    if results.get("config"):
        parts.append("<h3>configuration</h3>" + key_value_table(results["config"]))
    nested = {k: metrics.pop(k) for k in list(metrics) if isinstance(metrics[k], dict)}  # tool-call mix ...
    parts.append('<h3>metrics</h3><div id="eval-metrics">' + key_value_table(metrics) + "</div>")
    for name, table in nested.items():
        parts.append(f"<h3>{escape(name.replace('_', ' '))}</h3>"
                     + (key_value_table(table) if table else "<p>none</p>"))
    tasks = results.get("tasks") or []
    if tasks:
        parts.append(f'<h3>per task ({len(tasks)})</h3><div id="eval-tasks">' + rows_table(tasks) + "</div>")
    return "".join(parts)


def payload(run: rd.Run, tokenizer: Any | None, tokenizer_name: str) -> dict[str, Any]:
    """The JSON blob the page's script renders: trajectories, groups, tasks, token tables."""
    index = rd.TaskIndex(rd.domain_specs(run), run.warnings)
    for entry in run.entries:
        rd.ensure_scored(entry, index, run.warnings)
    strings: dict[str, int] = {}
    tasks: dict[str, dict[str, Any]] = {}
    token_seqs: dict[str, list[list[int]]] = {}
    for e in run.entries:
        if e.traj.token_ids:
            token_seqs.setdefault(e.traj.domain, []).append(e.traj.token_ids)
    table = PrefixTable(token_seqs)
    used_ids: set[int] = set()
    for p in table.prefixes:
        used_ids.update(p)
    trajectories = []
    for i, e in enumerate(run.entries):
        t = e.traj
        key = f"{t.domain}/{t.task_id}"
        task = index.task(t.domain, t.task_id)
        if key not in tasks and task is not None:
            tasks[key] = {"family": task.family, "split": task.split, "instruction": task.instruction,
                          "gold": [f"{a.name}({rd._args(a.arguments)})" + (" [user]" if a.actor == "user" else "")
                                   for a in task.gold_actions],
                          "required_outputs": task.required_outputs}
        system = next((m.content for m in t.messages if m.role == "system"), None)
        tokens = None
        if t.token_ids:
            tokens = table.encode(t.domain, t.token_ids, t.loss_mask, t.logprobs)
            used_ids.update(tokens["ids"])
        meta = {k: v for k, v in t.metadata.items() if _is_num(v) or isinstance(v, str | bool)}
        trajectories.append({
            "i": i, "task_id": t.task_id, "domain": t.domain, "family": task.family if task else None,
            "source": e.source, "step": e.step, "member": t.metadata.get("member"),
            "advantage": t.metadata.get("advantage"),
            "reward": t.reward.model_dump() if t.reward else None, "scored_here": e.scored_here,
            "stop_reason": t.stop_reason, "turns": t.turns, "malformed_calls": t.malformed_calls,
            "sim_fault": t.sim_fault, "fault": rd.fault_of(t), "user_seed": t.user_seed,
            "system": strings.setdefault(system, len(strings)) if system is not None else None,
            "events": rd.lanes(t), "tokens": tokens, "meta": meta,
        })
    return {
        "run": str(run.path), "overview": rd.overview(run), "warnings": run.warnings,
        "strings": list(strings), "tasks": tasks, "trajectories": trajectories, "groups": rd.groups(run.entries),
        "prefixes": table.prefixes, "vocab": vocab(tokenizer, used_ids), "tokenizer": tokenizer_name,
    }


def encode_blob(blob: dict[str, Any], compress: str = "auto") -> tuple[str, str]:
    """(encoding, text) for the data script: plain JSON, or gzip + base64 when large or asked for."""
    text = json.dumps(blob, ensure_ascii=False, separators=(",", ":"))
    if compress == "always" or (compress == "auto" and len(text) > COMPRESS_ABOVE):
        packed = base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")
        return "gzip+base64", packed
    return "json", text.replace("</", "<\\/")  # no "</script>" can end the data script early


def _asset(name: str) -> str:
    return resources.files("muarl.report").joinpath(name).read_text(encoding="utf-8")


def render(run: rd.Run, tokenizer: Any | None = None, tokenizer_name: str = "", compress: str = "auto") -> str:
    """The whole page as one string."""
    blob = payload(run, tokenizer, tokenizer_name)
    encoding, text = encode_blob(blob, compress)
    sections = []
    ov = blob["overview"]
    # the run's story first: a training run's headline curves and its settings; the file list last
    overview_html = [f"<h2>run</h2><p class='path'>{escape(str(run.path))}</p>"]
    if run.metrics:
        overview_html.append('<div class="charts" id="headline">' + "".join(charts(run.metrics, HEADLINE))
                             + f'</div><p><a href="#training" data-tab="training">every curve ({len(run.metrics)} '
                             "steps)</a></p>")
    if run.config and not run.results:  # an eval's config is in its results
        overview_html.append("<h3>settings (config.json)</h3>" + key_value_table(run.config))
    if ov["trajectories"]:
        overview_html.append(key_value_table(ov))
    if run.summary:
        overview_html.append("<h3>summary.json</h3>" + key_value_table(run.summary))
    if run.warnings:
        overview_html.append('<h3>warnings</h3><ul class="warnings">'
                             + "".join(f"<li>{escape(w)}</li>" for w in run.warnings) + "</ul>")
    overview_html.append("<h3>files</h3><p>" + ", ".join(f"<code>{escape(f)}</code>" for f in run.files) + "</p>")
    sections.append(("overview", "overview", "".join(overview_html)))
    if run.metrics:
        sections.append(("training", f"training ({len(run.metrics)} steps)",
                         '<div class="charts">' + "".join(charts(run.metrics)) + "</div>"))
    if run.results:
        sections.append(("evaluation", "evaluation", eval_section(run.results)))
    if ov["trajectories"]:
        sections.append(("trajectories", f"trajectories ({ov['trajectories']})", ""))
    if blob["groups"]:
        sections.append(("groups", f"groups ({len(blob['groups'])})", ""))
    nav = "".join(f'<a href="#{sid}" data-tab="{sid}">{escape(label)}</a>' for sid, label, _ in sections)
    body = "".join(f'<section id="sec-{sid}" class="tab" hidden>{html}</section>' for sid, _, html in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>muarl report: {escape(run.path.name)}</title>
<style>{_asset("viewer.css")}</style></head>
<body><header><h1>muarl report <span class="run-name">{escape(run.path.name)}</span></h1><nav>{nav}</nav></header>
<main>{body}<section id="sec-trajectory" class="tab" hidden></section>
<p id="loading">loading trajectories...</p></main>
<script id="muarl-data" type="application/json" data-encoding="{encoding}">{text}</script>
<script>{_asset("viewer.js")}</script></body></html>
"""


def build_report(run_dir: str | Path, out: str | Path | None = None, *, tokenizer: str | None = None,
                 max_trajectories: int | None = 5000, compress: str = "auto") -> Path:
    """Write the report of ``run_dir`` (default ``run_dir/report.html``) and return its path.

    ``tokenizer`` decodes token ids for the loss-mask overlay (default: the run's own checkpoint).
    The page is written to a temporary name and renamed, so an interrupted build never leaves half a
    report behind.
    """
    run = rd.load_run(run_dir, max_trajectories=max_trajectories)
    tok, tok_name = (None, "")
    if any(e.traj.token_ids for e in run.entries):
        tok, tok_name = find_tokenizer(run.path, tokenizer)
        if tok is None:
            run.warnings.append("no tokenizer found for the token overlay (pass --tokenizer PATH|tiny); "
                                "showing token ids")
    page = render(run, tok, tok_name, compress)
    target = Path(out) if out is not None else run.path / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, page)
