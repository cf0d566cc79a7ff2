"""The comparison page (muarl.report.comparison): its contract, checked on the HTML it writes, and the pairs
of changed episodes it takes from two real evaluations. The page in a real browser, on a real demo run:
tests/test_comparison_browser.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

import viewer_runs
from muarl.report import data as rd
from muarl.report.comparison import (
    build_comparison_report,
    change_pair,
    format_difference,
    href,
    paired_changes,
    render_comparison,
)

eval_run = viewer_runs.eval_run

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d4944415478da63f8cfc0f01f0005000201a1e3c7a40000000049454e44ae426082")


def matrix_report(tmp_path: Path) -> dict:
    """Three arms and two differences, as a train-user x eval-user comparison would give them."""
    (tmp_path / "plots").mkdir(exist_ok=True)
    (tmp_path / "plots" / "bars.png").write_bytes(PNG)
    return {
        "title": "ablation <demo>",
        "arms": [{"id": "method", "label": "interactive user", "detail": "the method", "href": "a/report.html"},
                 {"id": "static", "label": "static user"}, {"id": "base", "label": "cold start"}],
        "tables": [{
            "title": "held-out interactive users",
            "differences": [{"label": "method - static", "minus": "static", "plus": "method"},
                            {"label": "static - cold start", "minus": "base", "plus": "static"}],
            "rows": [
                {"metric": "success (pass^1)", "values": {"method": 0.5, "static": 0.25, "base": 0.125},
                 "differences": [{"diff": 0.25, "low": 0.1, "high": 0.4}, {"diff": 0.125, "low": -0.05, "high": 0.3}]},
                {"metric": "<b>turns</b>", "values": {"method": 6, "static": None, "base": "7 / 8"},
                 "differences": ["+1 / +2", None]},
                {"metric": "pass^1 with its own interval",
                 "values": {"method": {"value": 0.5, "low": 0.3, "high": 0.7}, "static": 0.2, "base": 0.1},
                 "differences": [{"diff": -0.3, "low": -0.5, "high": -0.1}, {"diff": 0.1}]},
            ],
            "note": "intervals: cluster bootstrap over tasks"}],
        "plots": [{"path": "plots/bars.png", "caption": "success by arm"}],
        "changed": {"title": "conversations that differ", "summary": "1 better, 0 worse", "pairs": [{
            "title": "task-1", "outcome": "better",
            "sides": [{"label": "static user", "reward": 0.0, "href": "s/report.html#traj/3",
                       "messages": [{"role": "user", "content": "hi </script><script>alert(1)</script>"},
                                    {"role": "assistant", "content": "",
                                     "tool_calls": [{"name": "find_user", "arguments": {"zip": "1"}}]},
                                    {"role": "tool", "content": "x" * 2000}]},
                      {"label": "interactive user", "reward": 1.0, "href": "a/report.html#traj/5",
                       "messages": [{"role": "user", "content": "hello"}]}]}]},
        "links": [{"label": "training", "href": "grpo/report.html#training", "detail": "curves"}],
    }


class Outline(HTMLParser):
    """Tags in document order, and what <main> holds first."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_the_page_opens_on_the_table_with_every_arm_difference_and_interval(tmp_path: Path) -> None:
    page = build_comparison_report(matrix_report(tmp_path), tmp_path / "report.html")
    html = page.read_text()
    outline = Outline()
    outline.feed(html)
    tags = [t for t, _ in outline.tags]
    after_main = outline.tags[tags.index("main") + 1:]
    assert after_main[0] == ("section", {"id": "results", "aria-label": "results"})
    assert after_main[1][0] == "table" and "comparison" in after_main[1][1]["class"]
    cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", html.split("<table", 1)[1].split("</table>", 1)[0])
    text = [re.sub(r"<[^>]+>", "", c) for c in cells]
    assert text[:6] == ["metric", "interactive user", "static user", "cold start", "method - static [95% interval]",
                        "static - cold start [95% interval]"]
    assert text[6:12] == ["success (pass^1)", "0.500", "0.250", "0.125", "+0.250 [+0.100, +0.400] * (excludes 0)",
                          "+0.125 [-0.050, +0.300]"]
    assert text[12:18] == ["&lt;b&gt;turns&lt;/b&gt;", "6", "n/a", "7 / 8", "+1 / +2", ""]
    assert text[18:24] == ["pass^1 with its own interval", "0.500 [0.300, 0.700]", "0.200", "0.100",
                           "-0.300 [-0.500, -0.100] * (excludes 0)", "+0.100"]
    assert html.count('class="num diff supported"') == 2  # bold where the interval excludes 0, nowhere else
    # the rest of the page, in order after the tables: plots, changed conversations, links
    ids = [a.get("id") for t, a in outline.tags if t == "section"]
    assert ids == ["results", "plots", "changed", "viewer"]
    img = next(a for t, a in outline.tags if t == "img")
    assert img["src"].startswith("data:image/png;base64,") and img["alt"] == "success by arm"
    assert "<script" not in html  # no script at all: the message's </script> is text
    assert "hi &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "x" * 600 + " ..." in html and "x" * 601 not in html  # long tool output cut (whole in the viewer)
    links = [a["href"] for t, a in outline.tags if t == "a"]
    assert {"s/report.html#traj/3", "a/report.html#traj/5", "grpo/report.html#training", "a/report.html"} <= set(links)
    assert not any(a.get("src", "").startswith(("http", "//")) for _, a in outline.tags)  # nothing fetched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize(("change", "error"), [
    (lambda r: r["arms"].__delitem__(slice(1, None)), "at least two arms"),
    (lambda r: r["arms"][1].update(id="method"), "arm ids repeat"),
    (lambda r: r["tables"][0]["differences"][0].update(plus="nobody"), "a difference needs"),
    (lambda r: r["tables"][0]["rows"][0]["differences"].pop(), "2 difference entries expected, got 1"),
    (lambda r: r["tables"][0]["rows"][0]["differences"][0].update(low=0.5), "low > high"),
    (lambda r: r["tables"][0]["rows"][0]["values"].update(other=1), "'values' must map arm ids"),
    (lambda r: r["tables"][0].update(rows=[]), "has no rows"),
    (lambda r: r["plots"].append({"path": "plots/x.pdf"}), "not an image type"),
    (lambda r: r["links"].append({"label": "x"}), "a link needs"),
    (lambda r: r.pop("tables"), "at least one table"),
])
def test_a_report_that_breaks_the_contract_is_refused_before_anything_is_written(tmp_path, change, error) -> None:
    report = matrix_report(tmp_path)
    change(report)
    with pytest.raises(ValueError, match=re.escape(error)):
        build_comparison_report(report, tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_optional_parts_may_be_left_out(tmp_path: Path) -> None:
    html = render_comparison({"title": "t", "arms": [{"id": "a"}, {"id": "b"}], "tables": [
        {"title": "x", "rows": [{"metric": "m", "values": {"a": 1.0, "b": 2.0}}]}]}, tmp_path)
    assert '<section id="results"' in html and "plots" not in html and 'id="changed"' not in html
    assert format_difference({"diff": 0.1}) == ("+0.100", "")


def test_href_is_relative_to_the_page(tmp_path: Path) -> None:
    assert href(tmp_path / "grpo" / "report.html", tmp_path / "report.html", "training") == "grpo/report.html#training"
    assert href(tmp_path / "grpo" / "report.html", tmp_path / "dev" / "report.html") == "../grpo/report.html"
    assert href(tmp_path / "a b" / "r.html", tmp_path / "report.html", "traj/3") == "a%20b/r.html#traj/3"


def test_paired_changes_pairs_the_same_trial_and_names_its_viewer_page(eval_run, tmp_path) -> None:
    """The expert against the same scripted users as the expert that skips confirmations (the viewer's eval
    run): same tasks, same seed, so the same user seeds; the change-of-mind task is what confirming fixes."""
    from muarl.domain import get_domain
    from muarl.evaluate import evaluate
    from muarl.policies.expert import ExpertPolicy
    from muarl.users.scripted import ScriptedUser

    better = tmp_path / "expert"
    evaluate(get_domain("retail"), ExpertPolicy(), ScriptedUser(), viewer_runs.retail_eval_tasks(), k=2,
             out_dir=better, progress=False)
    lines = (better / "trajectories.jsonl").read_text().splitlines()
    (better / "trajectories.jsonl").write_text("\n".join(reversed(lines)) + "\n")  # another order than run a's

    changes = paired_changes(eval_run, better)
    assert changes and all(c.gain == 1.0 for c in changes)
    assert {c.a.task_id for c in changes} == {t.id for t in viewer_runs.retail_eval_tasks()
                                              if t.family == "change_of_mind"}
    a_entries, b_entries = rd.load_run(eval_run).entries, rd.load_run(better).entries
    for c in changes:
        assert (c.a.task_id, c.a.user_seed) == (c.b.task_id, c.b.user_seed)
        assert a_entries[c.a_index].traj == c.a and b_entries[c.b_index].traj == c.b  # the viewer's #traj/N
    assert paired_changes(better, eval_run)[0].gain == -1.0  # the other way round: worse

    pair = change_pair(changes[0], ("skips confirmation", "expert"), ("a.html#traj/1", "b.html#traj/2"))
    assert pair["outcome"] == "better" and "reward 0 to 1" in pair["title"]
    assert [s["label"] for s in pair["sides"]] == ["skips confirmation", "expert"]
    said = [m for m in pair["sides"][1]["messages"] if m["role"] == "assistant" and m["tool_calls"]]
    assert [c["name"] for m in said for c in m["tool_calls"]] == [c.name for m in changes[0].b.messages
                                                                  for c in m.tool_calls]
