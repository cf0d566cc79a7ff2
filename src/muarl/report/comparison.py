"""The comparison page: arms compared metric by metric with paired intervals, then the plots, the
conversations that changed and links into the run viewer, in one self-contained HTML file.

Why a page of its own: a run directory that compares models (``muarl demo``: the cold start vs after RL;
``muarl ablate``: the method vs RL with a static user, models trained with one user and evaluated with
another) exists for its result, so its ``report.html`` opens on the table, not on a list of files. The
per-run pages (training curves, every episode, groups) stay the viewer's (:mod:`muarl.report.html`,
``muarl view``); this page links into them.

The page is built from a plain structure (dicts and lists, JSON-able but for plot paths) that the caller
assembles, so any comparison of two or more arms can use it; see :func:`build_comparison_report` for the
contract. Helpers build the parts that come from run directories the same way for every caller:
:func:`paired_changes` (episodes of the same task and user seed whose reward changed, with their places in
the viewer), :func:`change_pair` and :func:`conversation` (such a pair as the page shows it) and
:func:`href` (a link from the page to another file). Nothing is fetched: CSS and plots are inlined.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from muarl.files import atomic_write
from muarl.report import data as rd
from muarl.types import Trajectory

#: characters of a tool's output shown on the page (the viewer's episode page has it whole)
TOOL_OUTPUT_CHARS = 600
IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".gif": "image/gif", ".webp": "image/webp"}
#: what the page adds to the viewer's stylesheet
STYLE = """
main > section { margin-bottom: 28px; scroll-margin-top: 70px; }
details.pair { scroll-margin-top: 70px; }
table.comparison { margin: 4px 0 8px; }
table.comparison caption { caption-side: top; text-align: left; padding: 4px 0 6px; }
table.comparison caption h2 { font-size: 16px; margin: 0; }
table.comparison td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.comparison th[scope="row"] { font-weight: 600; background: #f8fafc; }
table.comparison .ci { color: #475569; }
table.comparison .supported { font-weight: 700; }
.note { color: #475569; max-width: 70em; }
dl.arms { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 8px 0; }
dl.arms dt { font-weight: 600; } dl.arms dd { margin: 0; }
.figures { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; background: #fff; border: 1px solid #e2e8f0; padding: 6px; max-width: 100%; }
figure img { display: block; max-width: 100%; height: auto; }
figcaption { font-size: 13px; color: #334155; margin-top: 4px; max-width: 560px; }
details.pair { background: #fff; border: 1px solid #e2e8f0; padding: 6px 12px; margin: 10px 0; }
details.pair > summary { font-weight: 600; cursor: pointer; }
.pair-sides { display: grid; grid-template-columns: repeat(auto-fit, minmax(340px, 1fr)); gap: 12px; margin-top: 8px; }
.side h3 { margin: 4px 0 6px; font-size: 14px; }
.turns { list-style: none; margin: 0; padding: 0; }
.turns li.ev { margin: 3px 0; }
.turns .who { font-weight: 700; margin-right: 6px; }
.turns pre { background: #f8fafc; }
ul.links li { margin: 3px 0; }
"""


# ---------- the parts that come from run directories ----------


@dataclass
class Change:
    """One episode played by two arms (the same task and user seed) whose reward differs.

    ``a_index`` / ``b_index`` are the episodes' places in their runs as the viewer numbers them (its
    ``#traj/N`` pages), for a viewer built with the same ``max_trajectories`` as :func:`paired_changes` read.
    """

    a: Trajectory
    b: Trajectory
    a_index: int
    b_index: int

    @property
    def gain(self) -> float:
        """b's reward minus a's (an episode without a reward counts 0)."""
        return _reward(self.b) - _reward(self.a)


def _reward(traj: Trajectory) -> float:
    return traj.reward.reward if traj.reward else 0.0


def paired_changes(a_dir: str | Path, b_dir: str | Path, max_trajectories: int | None = 0) -> list[Change]:
    """Episodes of run ``a_dir`` and run ``b_dir`` (evaluations: ``trajectories.jsonl``) with the same task
    and user seed, so the same trial of the same task, whose reward differs; improvements first, largest
    first, then the ones that got worse. Read as the viewer reads a run (:func:`muarl.report.data.load_run`
    with ``max_trajectories``; 0 or None: all), so ``Change.a_index`` and ``b_index`` name the episodes'
    pages in viewers built with the same value."""
    def episodes(folder: str | Path) -> dict[tuple[str, int | None], tuple[int, Trajectory]]:
        run = rd.load_run(folder, max_trajectories=max_trajectories)
        return {(e.traj.task_id, e.traj.user_seed): (i, e.traj) for i, e in enumerate(run.entries)}

    before, after = episodes(a_dir), episodes(b_dir)
    changes = [Change(a, after[key][1], i, after[key][0]) for key, (i, a) in before.items()
               if key in after and _reward(a) != _reward(after[key][1])]
    return sorted(changes, key=lambda c: -c.gain)  # stable: within a gain, in run a's order


def conversation(traj: Trajectory) -> list[dict[str, Any]]:
    """The episode as the page shows it: its messages after the system turn, each ``{"role": "user" |
    "assistant" | "tool", "content": str, "tool_calls": [{"name": str, "arguments": dict}]}``."""
    return [{"role": m.role, "content": m.content or "",
             "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]}
            for m in traj.messages if m.role != "system"]


def change_pair(change: Change, labels: Sequence[str], hrefs: Sequence[str | None] = (None, None),
                title: str | None = None) -> dict[str, Any]:
    """A :class:`Change` as an entry of the page's ``changed["pairs"]``: ``labels`` name arm a and arm b
    (``("cold start", "after RL")``), ``hrefs`` link each side to its episode (say ``href(viewer, page,
    f"traj/{change.a_index}")``); the title says which task, which user seed and how the reward moved."""
    a, b = change.a, change.b
    outcome = "better" if change.gain > 0 else "worse"
    return {
        "title": title or (f"{a.task_id}, user seed {a.user_seed}: {outcome} with {labels[1]} "
                           f"(reward {_reward(a):g} to {_reward(b):g})"),
        "outcome": outcome,
        "sides": [{"label": label, "reward": _reward(t), "href": link, "messages": conversation(t)}
                  for label, t, link in zip(labels, (a, b), hrefs, strict=True)],
    }


def href(target: str | Path, page: str | Path, fragment: str = "") -> str:
    """A relative link from the HTML file ``page`` to ``target`` (plus ``#fragment``), as the page's
    ``href`` fields expect: it works wherever the run directory is moved, and from ``file://``."""
    rel = Path(os.path.relpath(Path(target).resolve(), Path(page).resolve().parent)).as_posix()
    return quote(rel) + (f"#{fragment}" if fragment else "")


# ---------- formatting (shared with the command line's tables) ----------


def format_value(value: Any, digits: int = 3) -> str:
    """A table cell's value: a number to ``digits`` decimals, a string as given, None as "n/a"."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def format_difference(entry: Any, digits: int = 3) -> tuple[str, str]:
    """(change, interval) of a difference entry: ``{"diff": d, "low": l, "high": h}`` gives ``("+0.145",
    "[+0.055, +0.240]")``; without low and high the interval is ""; a string is the change as given."""
    if entry is None:
        return "", ""
    if isinstance(entry, str):
        return entry, ""
    change = f"{entry['diff']:+.{digits}f}"
    if entry.get("low") is None or entry.get("high") is None:
        return change, ""
    return change, f"[{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}]"


def _supported(entry: Any) -> bool:
    """The interval excludes 0."""
    if not isinstance(entry, Mapping) or entry.get("low") is None or entry.get("high") is None:
        return False
    return entry["low"] > 0 or entry["high"] < 0


# ---------- the contract, checked ----------


def validate(report: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first thing in ``report`` that breaks :func:`build_comparison_report`'s
    contract (a caller's mistake is said when the page is built, not shown as a blank cell)."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"comparison report: {what}")

    need(isinstance(report, Mapping), "the report must be a mapping")
    need(isinstance(report.get("title"), str) and bool(report["title"]), "a non-empty 'title' is required")
    arms = report.get("arms")
    need(isinstance(arms, Sequence) and len(arms) >= 2, "'arms' must list at least two arms")
    ids = [arm.get("id") if isinstance(arm, Mapping) else None for arm in arms]
    need(all(isinstance(i, str) and i for i in ids), "every arm needs an 'id' (a non-empty string)")
    need(len(set(ids)) == len(ids), f"arm ids repeat: {ids}")
    tables = report.get("tables")
    need(isinstance(tables, Sequence) and len(tables) >= 1, "'tables' must hold at least one table")
    for n, table in enumerate(tables):
        where = f"table {n} ({table.get('title', 'untitled') if isinstance(table, Mapping) else '?'})"
        need(isinstance(table, Mapping), f"{where} must be a mapping")
        shown = table.get("arms", ids)
        need(all(a in ids for a in shown), f"{where} names unknown arms: {[a for a in shown if a not in ids]}")
        diffs = table.get("differences", [])
        for d in diffs:
            need(isinstance(d, Mapping) and d.get("label") and d.get("minus") in ids and d.get("plus") in ids,
                 f"{where}: a difference needs a 'label' and arm ids 'minus' and 'plus', got {d!r}")
        rows = table.get("rows")
        need(isinstance(rows, Sequence) and len(rows) >= 1, f"{where} has no rows")
        for row in rows:
            need(isinstance(row, Mapping) and isinstance(row.get("metric"), str), f"{where}: a row needs 'metric'")
            values = row.get("values", {})
            need(isinstance(values, Mapping) and all(k in ids for k in values),
                 f"{where}, row {row['metric']!r}: 'values' must map arm ids to values")
            entries = row.get("differences", [])
            need(isinstance(entries, Sequence) and len(entries) == len(diffs),
                 f"{where}, row {row['metric']!r}: {len(diffs)} difference entries expected, got "
                 f"{len(entries) if isinstance(entries, Sequence) else entries!r}")
            for e in entries:
                if isinstance(e, Mapping):
                    need(isinstance(e.get("diff"), int | float), f"{where}, row {row['metric']!r}: "
                         f"a difference entry needs a number 'diff', got {e!r}")
                    if e.get("low") is not None and e.get("high") is not None:
                        need(e["low"] <= e["high"], f"{where}, row {row['metric']!r}: low > high in {e!r}")
                else:
                    need(e is None or isinstance(e, str), f"{where}, row {row['metric']!r}: a difference "
                         f"entry is a mapping, a string or None, got {e!r}")
    for plot in report.get("plots", []):
        need(isinstance(plot, Mapping) and plot.get("path"), f"a plot needs a 'path', got {plot!r}")
        need(Path(plot["path"]).suffix.lower() in IMAGE_TYPES,
             f"plot {plot['path']}: not an image type the page can inline ({', '.join(IMAGE_TYPES)})")
    changed = report.get("changed")
    if changed is not None:
        need(isinstance(changed, Mapping), "'changed' must be a mapping")
        for pair in changed.get("pairs", []):
            sides = pair.get("sides") if isinstance(pair, Mapping) else None
            need(isinstance(sides, Sequence) and len(sides) >= 2 and all(isinstance(s, Mapping) for s in sides),
                 f"a changed pair needs 'sides' (two or more), got {pair!r}"[:300])
    for link in report.get("links", []):
        need(isinstance(link, Mapping) and link.get("label") and link.get("href"),
             f"a link needs 'label' and 'href', got {link!r}")


# ---------- the page ----------


def _arm_label(arms: dict[str, Mapping[str, Any]], arm_id: str) -> str:
    return str(arms[arm_id].get("label") or arm_id)


def _table(table: Mapping[str, Any], arms: dict[str, Mapping[str, Any]], n: int) -> str:
    shown = list(table.get("arms", list(arms)))
    diffs = list(table.get("differences", []))
    interval = table.get("interval", "95% interval")
    digits = int(table.get("digits", 3))
    head = ['<th scope="col">metric</th>']
    for arm_id in shown:
        head.append(f'<th scope="col" class="num">{escape(_arm_label(arms, arm_id))}</th>')
    for d in diffs:
        head.append(f'<th scope="col" class="num">{escape(d["label"])} <span class="ci">[{escape(interval)}]'
                    "</span></th>")
    body = []
    supported_seen = False
    for row in table["rows"]:
        cells = [f'<th scope="row">{escape(row["metric"])}</th>']
        values = row.get("values", {})
        for arm_id in shown:
            value = values.get(arm_id)
            if isinstance(value, Mapping):  # a value with an interval of its own
                text = escape(format_value(value.get("value"), digits))
                if value.get("low") is not None and value.get("high") is not None:
                    text += (f' <span class="ci">[{escape(format_value(value["low"], digits))}, '
                             f'{escape(format_value(value["high"], digits))}]</span>')
                cells.append(f'<td class="num">{text}</td>')
            else:
                cells.append(f'<td class="num">{escape(format_value(value, digits))}</td>')
        for entry in row.get("differences", []):
            change, ci = format_difference(entry, digits)
            supported = _supported(entry)
            supported_seen |= supported
            mark = ' <span aria-hidden="true">*</span><span class="sr-only"> (excludes 0)</span>' if supported else ""
            cells.append(f'<td class="num diff{" supported" if supported else ""}">{escape(change)}'
                         + (f' <span class="ci">{escape(ci)}</span>' if ci else "") + f"{mark}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    caption = escape(str(table.get("title") or "comparison"))
    notes = []
    if supported_seen:
        notes.append("* bold: the interval excludes 0, a difference the evaluated tasks support.")
    if table.get("note"):
        notes.append(escape(str(table["note"])))
    return (f'<table class="grid comparison" id="comparison-table{"" if n == 0 else f"-{n}"}">'
            f"<caption><h2>{caption}</h2></caption><thead><tr>{''.join(head)}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
            + "".join(f'<p class="note">{note}</p>' for note in notes))


def _image(path: Path) -> str:
    kind = IMAGE_TYPES[path.suffix.lower()]
    return f"data:{kind};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figures(plots: Sequence[Mapping[str, Any]], base: Path) -> str:
    out = []
    for plot in plots:
        path = Path(plot["path"])
        path = path if path.is_absolute() else base / path
        caption = str(plot.get("caption") or path.stem.replace("_", " "))
        alt = str(plot.get("alt") or caption)
        if not path.exists():
            out.append(f'<figure class="missing"><figcaption>{escape(caption)}: {escape(str(path))} is missing'
                       "</figcaption></figure>")
            continue
        out.append(f'<figure><img src="{_image(path)}" alt="{escape(alt)}">'
                   f"<figcaption>{escape(caption)}</figcaption></figure>")
    return f'<div class="figures">{"".join(out)}</div>'


def _turn(message: Mapping[str, Any]) -> str:
    role = message.get("role", "")
    lane, who = {"user": ("user", "user"), "assistant": ("agent", "agent"), "tool": ("tools", "tool")}.get(
        role, ("tools", role))
    content = str(message.get("content") or "")
    parts = [f'<span class="who">{escape(who)}</span>']
    if role == "tool":
        cut = content if len(content) <= TOOL_OUTPUT_CHARS else content[:TOOL_OUTPUT_CHARS] + " ..."
        parts.append(f"<pre>{escape(cut)}</pre>")
    elif content.strip():
        parts.append(f'<span class="text">{escape(content)}</span>')
    for call in message.get("tool_calls") or []:
        args = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        parts.append(f'<code class="args"><span class="tool-name">{escape(str(call.get("name")))}</span>'
                     f"({escape(args)})</code>")
    if role == "assistant" and not content.strip() and not message.get("tool_calls"):
        parts.append('<span class="text">(empty message)</span>')
    return f'<li class="ev lane-{lane}">{"".join(parts)}</li>'


def _pair(pair: Mapping[str, Any], n: int, open_: bool) -> str:
    sides = []
    for side in pair["sides"]:
        reward = side.get("reward")
        badge = ""
        if isinstance(reward, int | float):
            badge = f' <span class="badge {"pass" if reward >= 1 else "fail"}">reward {reward:g}</span>'
        link = (f' <a class="viewer-link" href="{escape(str(side["href"]), quote=True)}">this episode in the '
                f"viewer<span class=\"sr-only\"> ({escape(str(side.get('label', '')))})</span></a>"
                if side.get("href") else "")
        turns = "".join(_turn(m) for m in side.get("messages", []))
        sides.append(f'<div class="side"><h3>{escape(str(side.get("label", "")))}{badge}</h3>'
                     f'<p>{link}</p><ol class="turns">{turns}</ol></div>')
    outcome = escape(str(pair.get("outcome", "")))
    return (f'<details class="pair" id="pair-{n}" data-outcome="{outcome}"{" open" if open_ else ""}>'
            f"<summary>{escape(str(pair.get('title', f'pair {n + 1}')))}</summary>"
            f'<div class="pair-sides">{"".join(sides)}</div></details>')


def _links(links: Sequence[Mapping[str, Any]]) -> str:
    items = []
    for link in links:
        detail = f" <span class=\"note\">{escape(str(link['detail']))}</span>" if link.get("detail") else ""
        items.append(f'<li><a href="{escape(str(link["href"]), quote=True)}">{escape(str(link["label"]))}</a>'
                     f"{detail}</li>")
    return f'<ul class="links">{"".join(items)}</ul>'


def _asset(name: str) -> str:
    from importlib import resources

    return resources.files("muarl.report").joinpath(name).read_text(encoding="utf-8")


SR_ONLY = (".sr-only { position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px; overflow: hidden; "
           "clip: rect(0, 0, 0, 0); white-space: nowrap; border: 0; }")


def render_comparison(report: Mapping[str, Any], base: str | Path = ".") -> str:
    """The page as one string (``base``: the folder relative plot paths start from); see
    :func:`build_comparison_report`."""
    validate(report)
    base = Path(base)
    arms = {arm["id"]: arm for arm in report["arms"]}
    sections: list[tuple[str, str, str]] = []  # (id, navigation label, html)

    results = [_table(table, arms, n) for n, table in enumerate(report["tables"])]
    if report.get("intro"):
        results.append(f'<p class="note" id="intro">{escape(str(report["intro"]))}</p>')
    described = [arm for arm in report["arms"] if arm.get("detail") or arm.get("href")]
    if described:
        items = []
        for arm in described:
            link = (f' (<a href="{escape(str(arm["href"]), quote=True)}">its episodes in the viewer</a>)'
                    if arm.get("href") else "")
            items.append(f"<dt>{escape(_arm_label(arms, arm['id']))}</dt>"
                         f"<dd>{escape(str(arm.get('detail') or ''))}{link}</dd>")
        results.append(f'<h3>arms</h3><dl class="arms">{"".join(items)}</dl>')
    if report.get("facts"):
        from muarl.report.html import key_value_table

        results.append("<h3>run</h3>" + key_value_table(dict(report["facts"])))
    sections.append(("results", "results", "".join(results)))

    if report.get("plots"):
        sections.append(("plots", "plots", "<h2>plots</h2>" + _figures(report["plots"], base)))
    changed = report.get("changed")
    if changed is not None:
        pairs = list(changed.get("pairs", []))
        title = escape(str(changed.get("title") or "conversations that changed"))
        body = [f"<h2>{title}</h2>"]
        if changed.get("summary"):
            body.append(f'<p id="changed-summary">{escape(str(changed["summary"]))}</p>')
        opened = int(changed.get("open", 2))
        body.extend(_pair(p, n, n < opened) for n, p in enumerate(pairs))
        if not pairs:
            body.append("<p>No episode's reward changed.</p>")
        sections.append(("changed", f"changed conversations ({len(pairs)})", "".join(body)))
    if report.get("links"):
        sections.append(("viewer", "viewer pages", "<h2>viewer pages</h2>" + _links(report["links"])))

    nav = "".join(f'<a href="#{sid}">{escape(label)}</a>' for sid, label, _ in sections)
    body = "".join(f'<section id="{sid}" aria-label="{escape(label)}">{html}</section>'
                   for sid, label, html in sections)
    subtitle = f' <span class="run-name">{escape(str(report["subtitle"]))}</span>' if report.get("subtitle") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(str(report["title"]))}</title>
<style>{_asset("viewer.css")}{STYLE}{SR_ONLY}</style></head>
<body><header><h1>{escape(str(report["title"]))}{subtitle}</h1><nav aria-label="sections">{nav}</nav></header>
<main id="main">{body}</main></body></html>
"""


def build_comparison_report(report: Mapping[str, Any], out: str | Path) -> Path:
    """Write the comparison page ``out`` (an ``.html`` file) from ``report`` and return its path.

    The page opens on the comparison table(s) (the first thing in ``<main>``), then the plots, the
    conversations that changed and the links into the viewer; each part but the tables is optional. It is
    one self-contained file (the viewer's stylesheet and every plot inlined, no script, nothing fetched),
    written to a temporary name and renamed so a reader never sees half a page. ``report`` is a plain
    mapping; relative paths and links are relative to ``out``'s folder (:func:`href` makes them)::

        {
          "title": str,                          # required: the page's <title> and heading
          "subtitle": str,                       # optional: beside the heading (the run directory, say)
          "intro": str,                          # optional: a sentence or two under the tables, plain text
          "arms": [                              # required, two or more: what is compared
            {"id": str,                          #   unique; tables and differences name arms by it
             "label": str,                       #   column heading (default: the id)
             "detail": str,                      #   optional: what the arm is, listed under the tables
             "href": str},                       #   optional: its episodes in the viewer
          ],
          "tables": [                            # required, one or more; the first opens the page
            {"title": str,                       #   the table's caption
             "arms": [arm id, ...],              #   optional: the value columns, in order (default: all)
             "differences": [                    #   optional: one column per difference of two arms
               {"label": str,                    #     its heading ("after RL - cold start")
                "minus": arm id, "plus": arm id}],  # the difference is plus - minus
             "interval": str,                    #   optional: the intervals' name (default "95% interval")
             "digits": int,                      #   optional: decimals (default 3)
             "note": str,                        #   optional: under the table (how intervals were made)
             "rows": [
               {"metric": str,                   #     the row's heading
                "values": {arm id: value},       #     a number, a string (shown as given), None ("n/a"),
                                                 #     or {"value": x, "low": l, "high": h}: with its interval
                "differences": [entry, ...]}]},  #     one per difference column, in order: {"diff": d,
          ],                                     #     "low": l, "high": h} (low/high optional), a string, None
          "facts": {str: value},                 # optional: key / value table under the tables (domain, ...)
          "plots": [{"path": str | Path,         # optional: .png / .svg / .jpg / .gif / .webp, inlined
                     "caption": str, "alt": str}],  # alt defaults to the caption
          "changed": {                           # optional: conversations that differ between two arms
            "title": str, "summary": str,        #   the heading; a sentence (how many better, how many worse)
            "open": int,                         #   how many pairs start unfolded (default 2)
            "pairs": [{"title": str, "outcome": str,   # "better" / "worse" (a data attribute, for tests)
                       "sides": [{"label": str, "reward": float, "href": str,  # href: the episode's
                                  "messages": [{"role": str, "content": str,    # viewer page
                                                "tool_calls": [{"name": str, "arguments": dict}]}]}]}],
          },
          "links": [{"label": str, "href": str, "detail": str}],  # optional: viewer pages, files
        }

    A difference whose interval excludes 0 is shown in bold with a marker (and says so to a screen
    reader). :func:`change_pair` builds a ``pairs`` entry from :func:`paired_changes`; a malformed
    ``report`` raises ValueError (:func:`validate`) before anything is written.
    """
    target = Path(out)
    page = render_comparison(report, target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, page)
