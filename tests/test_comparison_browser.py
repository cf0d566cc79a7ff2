"""The demo's report.html in headless Chromium, as a new user opens it: the comparison table first, then the
plots, the held-out conversations RL changed, and links that open the viewer's trajectory and training
pages. Run on a real smoke demo (``--preset smoke``, seconds on two cores).

The smoke run's RL is two steps on a model that fails every task, so nothing changes; the fixture makes
one change the way a better model would: one held-out episode of the after-RL evaluation is replaced by
the expert's play of the same task with the same user seed (a real conversation, reward 1), and the demo
is rerun on the finished run directory, which recomputes the evaluation, the comparison and the page.

:func:`assert_comparison_page` is the check, for any run directory whose report.html is the comparison
page (``muarl ablate``'s too); on the run viewer's page (what the demo wrote before) it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import test_viewer_browser as viewer_browser
from muarl.demo import run_demo
from muarl.experiments.recipe import PRESETS
from muarl.types import Trajectory

browser = viewer_browser.browser  # headless Chromium, as the viewer's browser test starts it
_assert_screenshot, _css, _wait = viewer_browser._assert_screenshot, viewer_browser._css, viewer_browser._wait
_no_console_errors = viewer_browser._no_console_errors
assert_local_links_resolve = viewer_browser.assert_local_links_resolve
pytestmark = pytest.mark.slow


def _load(path: Path) -> list[Trajectory]:
    return [Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trajectory]:
    """A smoke demo whose after-RL evaluation fixed one episode (the expert's play of it); the page rebuilt
    by rerunning the demo. Returns the run directory and that episode."""
    # as the README runs it: from a working directory, with a relative run directory (a page that joins it to
    # its own folder again finds no plots)
    base, relative = tmp_path_factory.mktemp("demo"), Path("runs") / "smoke"
    with working_directory(base):
        return _fixed_run(base / relative, relative)


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Run the block from ``path`` (as a user's commands run from theirs), the old one restored after."""
    cwd = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(cwd)


def _fixed_run(out: Path, relative: Path) -> tuple[Path, Trajectory]:
    from muarl.domain import get_domain
    from muarl.policies.expert import ExpertPolicy
    from muarl.rollout import EpisodeConfig, run_episode
    from muarl.users.scripted import ScriptedUser

    run_demo(relative, "smoke", progress=False)
    first = (out / "report.html").read_text()
    smoke = PRESETS["smoke"]
    rl = out / "eval-rl" / "trajectories.jsonl"
    trajs = _load(rl)
    assert all(t.reward and t.reward.reward == 0 for t in trajs + _load(out / "eval-sft" / "trajectories.jsonl"))
    old = trajs[1]
    domain = get_domain(smoke.domain)
    task = next(t for t in domain.tasks("test") if t.id == old.task_id)
    fixed = asyncio.run(run_episode(domain, task, ExpertPolicy(), ScriptedUser(), seed=old.user_seed,
                                    config=EpisodeConfig(max_turns=smoke.grpo.max_turns)))
    assert fixed.reward and fixed.reward.reward == 1.0
    fixed.metadata = old.metadata  # the same trial of the evaluation (member), so the rerun resumes it
    trajs[1] = fixed
    # in another order than the cold start's (as two evaluations finish episodes), so a link that took the
    # episode's place in the wrong file would open another episode
    rl.write_text("".join(t.model_dump_json() + "\n" for t in reversed(trajs)))

    summary = run_demo(relative, "smoke", progress=False)  # the finished run: only the summary and report again
    assert summary["rl"]["pass^1"] == 1 / (smoke.eval_tasks * smoke.eval_k)
    assert (out / "report.html").read_text() != first  # rebuilt: the page shows the change
    return out, fixed


def _first_in_main(driver) -> dict:
    return driver.execute_script("""
        const main = document.querySelector('main');
        const first = main && main.firstElementChild;
        const table = first && first.querySelector('table');
        return {first: first ? first.id : null,
                table_first: !!table && first.firstElementChild === table,
                table_class: table ? table.className : null,
                top: table ? table.getBoundingClientRect().top : null};""")


def assert_accessible(driver) -> None:
    """What a screen reader and a keyboard need of the page: its language, headings that never skip a level
    going deeper, a caption and scoped headers on every table, alt text on every image, text on every link."""
    found = driver.execute_script("""
        const levels = [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')].map(h => Number(h.tagName[1]));
        return {lang: document.documentElement.lang, levels,
                tables: [...document.querySelectorAll('main table.comparison')].map(t =>
                    !!t.caption && t.caption.textContent.trim() !== '' &&
                    [...t.querySelectorAll('th')].every(th => th.scope === 'col' || th.scope === 'row')),
                no_alt: [...document.images].filter(i => !(i.getAttribute('alt') || '').trim()).length,
                no_text: [...document.links].filter(a => !a.textContent.trim()).map(a => a.href)};""")
    assert found["lang"] == "en"
    levels = found["levels"]
    assert levels[0] == 1 and all(b <= a + 1 for a, b in zip(levels[:-1], levels[1:], strict=True)), levels
    assert found["tables"] and all(found["tables"]), found["tables"]
    assert found["no_alt"] == 0 and found["no_text"] == [], found


def assert_plots_drawn(driver, count: int) -> None:
    """The page's ``count`` plots, each inlined and drawn (an image that did not load has no width)."""
    images = _css(driver, "section#plots figure img")
    assert len(images) == count and not _css(driver, "section#plots figure.missing")
    for img in images:
        assert img.get_attribute("src").startswith("data:image/png;base64,") and img.get_attribute("alt")
        assert driver.execute_script("return arguments[0].naturalWidth", img) > 100


def assert_comparison_page(driver, page: Path) -> dict:
    """Open ``page`` (a comparison report.html) and check what a new user sees first: the first thing in
    <main> is the comparison table, near the top of the window, with a value per arm and a 95% interval;
    returns the table as {row heading: [cells]} for the caller's own checks."""
    driver.get(page.resolve().as_uri())
    _wait(lambda: driver.execute_script("return document.readyState === 'complete'"))
    first = _first_in_main(driver)
    assert first["first"] == "results" and first["table_first"], first
    assert "comparison" in first["table_class"].split() and first["top"] < 200, first
    table = driver.find_element("css selector", "main > section#results > table.comparison")
    heads = [e.text for e in table.find_elements("css selector", "thead th")]
    assert len(heads) >= 4 and "95% interval" in heads[-1], heads
    rows = {r.find_element("css selector", "th").text: [td.text for td in r.find_elements("css selector", "td")]
            for r in table.find_elements("css selector", "tbody tr")}
    assert rows and all(len(cells) == len(heads) - 1 for cells in rows.values())
    return rows


def test_the_demo_report_opens_on_the_comparison_and_links_into_the_viewer(browser, demo_run, tmp_path):
    out, fixed = demo_run
    summary = json.loads((out / "summary.json").read_text())
    comparison = {m["metric"]: m for m in json.loads((out / "comparison.json").read_text())["metrics"]}
    greedy = {m["metric"]: m for m in json.loads((out / "comparison-greedy.json").read_text())["metrics"]}

    # the table first: cold start, after RL, the change and its paired interval, as the run computed them
    rows = assert_comparison_page(browser, out / "report.html")
    p1 = comparison["pass^1"]
    assert rows["success (pass^1)"] == [f"{summary['sft']['pass^1']:.3f}", f"{summary['rl']['pass^1']:.3f}",
                                        f"{summary['rl']['pass^1'] - summary['sft']['pass^1']:+.3f} "
                                        f"[{p1['low']:+.3f}, {p1['high']:+.3f}]"]
    assert rows["success (pass^1), T = 0"][2].endswith(f"[{greedy['pass^1']['low']:+.3f}, "
                                                       f"{greedy['pass^1']['high']:+.3f}]")
    k = PRESETS["smoke"].eval_k
    assert list(rows)[:5] == ["success (pass^1)", "fault rate: policy / user / tool", "success (pass^1), T = 0",
                              "fault rate: policy / user / tool, T = 0", f"pass^{k}"]

    assert_plots_drawn(browser, 3)

    # the conversation RL changed: the one fixed episode, before and after, side by side
    pairs = _css(browser, "section#changed details.pair")
    assert len(pairs) == 1 and pairs[0].get_attribute("data-outcome") == "better"
    assert "1 episodes went from failure to success, 0 the other way" in browser.find_element(
        "id", "changed-summary").text
    before, after = pairs[0].find_elements("css selector", ".side")
    assert before.find_element("css selector", "h3").text == "cold start reward 0"
    assert after.find_element("css selector", "h3").text == "after RL reward 1"
    calls = [e.text for e in after.find_elements("css selector", ".lane-agent .tool-name")]
    assert calls == [c.name for m in fixed.messages for c in m.tool_calls] and calls
    said = " ".join(after.text.split())
    assert all(" ".join(m.content.split()) in said for m in fixed.messages if m.role == "user")
    assert_accessible(browser)
    assert_local_links_resolve(browser)
    _assert_screenshot(browser, tmp_path / "comparison.png")
    _no_console_errors(browser)

    # its "after RL" link opens the viewer on that very episode
    after.find_element("css selector", "a.viewer-link").click()
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    assert browser.current_url.split("#")[0].split("/")[-2:] == ["eval-rl", "report.html"]
    title = _wait(lambda: [e for e in _css(browser, "#traj-title") if e.is_displayed()])[0].text
    assert f" {fixed.task_id} " in f" {title} " and "reward 1" in title
    agent = " ".join(e.text for e in _css(browser, "#lanes .ev.lane-agent .tool-name"))
    assert agent.split() == [c.name for m in fixed.messages for c in m.tool_calls]
    facts = browser.find_element("css selector", "table.facts").text
    assert f"user seed {fixed.user_seed}" in facts
    _no_console_errors(browser)

    # the cold start's side opens its own episode: same task, same user seed, reward 0
    assert_comparison_page(browser, out / "report.html")
    _css(browser, "section#changed .side")[0].find_element("css selector", "a.viewer-link").click()
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    assert browser.current_url.split("#")[0].split("/")[-2:] == ["eval-sft", "report.html"]
    title = _wait(lambda: [e for e in _css(browser, "#traj-title") if e.is_displayed()])[0].text
    assert f" {fixed.task_id} " in f" {title} " and "reward 0" in title
    assert f"user seed {fixed.user_seed}" in browser.find_element("css selector", "table.facts").text

    # and the training link opens GRPO's curves, one point per step
    assert_comparison_page(browser, out / "report.html")
    link = next(a for a in _css(browser, "section#viewer a") if a.text == "GRPO training curves")
    link.click()
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    charts = _wait(lambda: [e for e in _css(browser, "#sec-training svg.chart") if e.is_displayed()])
    assert charts[0].get_attribute("aria-label") == "reward"
    assert len(charts[0].find_elements("css selector", "circle")) == PRESETS["smoke"].grpo.steps
    assert_local_links_resolve(browser)
    _no_console_errors(browser)


def test_the_check_fails_on_the_run_viewer_page(browser, demo_run, tmp_path):
    """What ``muarl demo`` wrote before: the GRPO run's viewer, opening on a list of file names."""
    from muarl.report import build_report

    out, _ = demo_run
    old = build_report(out / "grpo", tmp_path / "report.html")
    with pytest.raises(AssertionError):
        assert_comparison_page(browser, old)
