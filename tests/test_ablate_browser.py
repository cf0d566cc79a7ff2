"""`muarl ablate`'s report.html in headless Chromium (issue 32): it opens on the matrix, the method minus
static-user RL with its paired interval in the first row (the interactive user's), as the run computed it;
then the plots, the held-out conversation that differs between the arms, and links into the viewer.

The smoke run's models fail every task, so, as the demo's browser test does, one episode of the method's
evaluation with the interactive user is replaced by the expert's play of the same trial and the finished
ablation is rerun, which recomputes its results and the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import test_comparison_browser as comparison_browser
from conftest import play_episode
from muarl.ablation.layout import eval_name
from muarl.ablation.run import run_ablate
from muarl.experiments.recipe import PRESETS
from muarl.types import Trajectory

browser = comparison_browser.browser
_css, _wait = comparison_browser._css, comparison_browser._wait
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ablation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trajectory]:
    """A smoke ablation whose method fixed one episode with the interactive user; the results rebuilt."""
    from muarl.domain import get_domain

    base, relative = tmp_path_factory.mktemp("ablate"), Path("runs") / "smoke"  # as the README runs it
    out = base / relative
    with comparison_browser.working_directory(base):
        run_ablate(relative, "smoke", progress=False, greedy=False)
    smoke = PRESETS["smoke"]
    path = out / eval_name("rl-scripted", "scripted") / "trajectories.jsonl"
    trajs = [Trajectory.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    old = trajs[1]
    domain = get_domain(smoke.domain)
    task = next(t for t in domain.tasks("test") if t.id == old.task_id)
    fixed = play_episode(domain, task, seed=old.user_seed)  # the expert's play of the same trial
    assert fixed.reward and fixed.reward.reward == 1.0
    fixed.metadata = old.metadata
    trajs[1] = fixed
    path.write_text("".join(t.model_dump_json() + "\n" for t in reversed(trajs)))
    with comparison_browser.working_directory(base):  # finished: only the results and the page again
        run_ablate(relative, "smoke", progress=False, greedy=False)
    return out, fixed


def test_the_ablation_report_opens_on_the_matrix_and_links_into_the_viewer(browser, ablation) -> None:
    out, fixed = ablation
    summary = json.loads((out / "summary.json").read_text())
    rows = comparison_browser.assert_comparison_page(browser, out / "report.html")
    heads = [e.text for e in _css(browser, "main > section#results > table.comparison thead th")]
    assert heads[1:4] == ["cold start", "RL, scripted user (the method)", "RL, static user"]
    assert heads[4].startswith("RL scripted - RL static")
    first = list(rows)[0]
    assert first == "evaluated with the scripted user (interactive)"
    diff, low, high = summary["differences"]["rl-scripted - rl-static"]["scripted"]["pass^1"]
    assert diff > 0 and rows[first][3].startswith(f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]")
    cell = summary["matrix"]["scripted"]["rl-scripted"]
    assert rows[first][1] == f"{cell['value']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}]"
    comparison_browser.assert_plots_drawn(browser, 4)
    comparison_browser.assert_accessible(browser)
    comparison_browser.assert_local_links_resolve(browser)

    pairs = _css(browser, "section#changed details.pair")
    assert len(pairs) == 1 and pairs[0].get_attribute("data-outcome") == "better"
    static_side, method_side = pairs[0].find_elements("css selector", ".side")
    assert method_side.find_element("css selector", "h3").text == "RL, scripted user (the method) reward 1"
    method_side.find_element("css selector", "a.viewer-link").click()
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    assert browser.current_url.split("#")[0].endswith("/eval/rl-scripted/scripted/report.html")
    title = _wait(lambda: [e for e in _css(browser, "#traj-title") if e.is_displayed()])[0].text
    assert f" {fixed.task_id} " in f" {title} " and "reward 1" in title

    comparison_browser.assert_comparison_page(browser, out / "report.html")
    link = next(a for a in _css(browser, "section#viewer a") if a.text == "GRPO with the static user: training curves")
    link.click()
    _wait(lambda: browser.execute_script("return document.body.dataset.ready === '1'"))
    charts = _wait(lambda: [e for e in _css(browser, "#sec-training svg.chart") if e.is_displayed()])
    assert len(charts[0].find_elements("css selector", "circle")) == PRESETS["smoke"].grpo.steps
