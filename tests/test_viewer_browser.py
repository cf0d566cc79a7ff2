"""The HTML report in a real headless Chromium (Debian's chromium + chromedriver, driven by selenium).

Opens reports of real runs from ``file://`` (no server, no network), clicks through to trajectories and
checks that what the page shows is the run's actual content, then saves screenshots. A missing browser is
a failure, not a skip: ``bash scripts/install.sh --dev`` installs it, and CI must run this test.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import viewer_runs
from conftest import run_muarl
from muarl.report import build_report
from muarl.report.tokens import find_tokenizer
from muarl.types import Trajectory

eval_run, training_run = viewer_runs.eval_run, viewer_runs.training_run
pytestmark = pytest.mark.slow


def _find(env: str, names: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: bash scripts/install.sh --dev (or pip install 'muarl[view]')")
    binary = _find("MUARL_CHROMIUM", ("chromium", "chromium-browser", "google-chrome"))
    driver_path = _find("MUARL_CHROMEDRIVER", ("chromedriver",))
    if not binary or not driver_path:
        pytest.fail("chromium and chromedriver are needed for the viewer's browser test: "
                    "bash scripts/install.sh --dev (apt-get install chromium chromium-driver), or set "
                    "MUARL_CHROMIUM / MUARL_CHROMEDRIVER")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800", "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def _wait(predicate, timeout: float = 15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the page")


def _open(driver, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    _wait(lambda: driver.execute_script("return document.body.dataset.ready === '1'"))


def assert_local_links_resolve(driver) -> None:
    """Every link of the open page to a local file names one that exists (the fragment aside)."""
    from urllib.parse import unquote, urlparse

    hrefs = driver.execute_script("return [...document.links].map(a => a.href)")
    local = [Path(unquote(urlparse(h).path)) for h in hrefs if h.startswith("file:")]
    assert [p for p in local if not p.exists()] == [], local


def _css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def _assert_screenshot(driver, path: Path) -> None:
    import matplotlib.image

    driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1000 and height >= 1000, (width, height)
    pixels = matplotlib.image.imread(str(path))[..., :3].reshape(-1, 3)
    colors = {tuple(p) for p in (pixels[:: max(1, len(pixels) // 20000)] * 255).astype(int).tolist()}
    assert len(colors) > 50 and pixels.std() > 0.05  # text, lanes and badges, not a blank page


def _no_console_errors(driver) -> None:
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe


def test_report_of_an_evaluation_run_in_chromium(browser, eval_run, tmp_path):
    report = build_report(eval_run, tmp_path / "eval.html")
    trajs = [Trajectory.model_validate_json(line) for line in (eval_run / "trajectories.jsonl").read_text().splitlines()]
    results = json.loads((eval_run / "results.json").read_text())
    _open(browser, report)

    # evaluation tables
    browser.find_element("css selector", 'nav a[data-tab="evaluation"]').click()
    metrics = _wait(lambda: [e for e in _css(browser, "#eval-metrics") if e.is_displayed()])[0].text
    assert f"pass^1 {results['metrics']['pass^1']}" in metrics
    assert all(row["task_id"] in browser.find_element("id", "eval-tasks").text for row in results["tasks"])

    # the list, filtered to failures, then one trajectory
    browser.find_element("css selector", 'nav a[data-tab="trajectories"]').click()
    _wait(lambda: _css(browser, "#traj-table tbody tr"))
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "f-reward")).select_by_value("fail")
    failed = [t for t in trajs if t.reward.reward < 1]
    _wait(lambda: len(_css(browser, "#traj-table tbody tr")) == len(failed))
    link = _css(browser, "#traj-table tbody tr a.traj-link")[0]
    index = int(link.get_attribute("href").rsplit("/", 1)[1])
    link.click()
    lanes = _wait(lambda: [e for e in _css(browser, "#lanes") if e.is_displayed()])[0]
    traj = trajs[index]
    assert traj.reward.reward < 1 and traj.reward.diff

    agent_text = " ".join(e.text for e in lanes.find_elements("css selector", ".ev.lane-agent"))
    said = [m.content for m in traj.messages if m.role == "assistant" and m.content.strip()]
    assert said and all(" ".join(s.split()) in " ".join(agent_text.split()) for s in said)
    user_text = " ".join(" ".join(e.text.split()) for e in lanes.find_elements("css selector", ".ev.lane-user"))
    assert all(" ".join(m.content.split()) in user_text for m in traj.messages if m.role == "user")
    tool_names = [e.text for e in lanes.find_elements("css selector", ".ev.lane-tools .tool-name")]
    assert tool_names == [r.name for r in traj.tool_log]
    called = [e.text for e in lanes.find_elements("css selector", ".ev.lane-agent .tool-name")]
    assert called == [c.name for m in traj.messages for c in m.tool_calls]

    for lane in ("agent", "user", "tools"):  # each event is drawn in its own lane's column
        x = lanes.find_element("css selector", f".lane-head.lane-{lane}").location["x"]
        assert {e.location["x"] for e in lanes.find_elements("css selector", f".ev.lane-{lane}")} == {x}

    diff = browser.find_element("id", "diff").text
    assert all(line in diff for line in traj.reward.diff)
    reward = browser.find_element("id", "reward").text
    assert "db_match false" in reward and f"stop reason {traj.stop_reason}" in reward
    assert all(v.kind in reward for v in traj.reward.violations)
    assert browser.find_element("id", "traj-title").text.startswith(f"#{index} {traj.task_id}")
    _assert_screenshot(browser, tmp_path / "trajectory.png")
    _no_console_errors(browser)


def test_report_of_a_training_run_in_chromium(browser, training_run, tmp_path):
    report = build_report(training_run, tmp_path / "train.html", compress="always")  # the gzip path
    assert 'data-encoding="gzip+base64"' in report.read_text()
    _open(browser, report)
    metrics = [json.loads(line) for line in (training_run / "metrics.jsonl").read_text().splitlines()]

    # the page opens on the run's story: the headline curves, then its settings; the file list last
    headline = _wait(lambda: [e for e in _css(browser, "#sec-overview #headline svg.chart") if e.is_displayed()])
    assert [c.get_attribute("aria-label") for c in headline][:2] == ["reward", "groups all correct / all wrong"]
    order = browser.execute_script("""return [...document.querySelectorAll('#sec-overview #headline, #sec-overview h3')]
        .map(e => e.id || e.textContent)""")
    assert order[0] == "headline" and order[1] == "settings (config.json)" and order[-1] == "files", order
    assert json.loads((training_run / "config.json").read_text())["model"] in browser.find_element(
        "id", "sec-overview").text

    browser.find_element("css selector", 'nav a[data-tab="training"]').click()
    charts = _wait(lambda: [e for e in _css(browser, "#sec-training svg.chart") if e.is_displayed()])
    assert charts[0].get_attribute("aria-label") == "reward"
    assert len(charts[0].find_elements("css selector", "circle")) == len(metrics)

    browser.find_element("css selector", 'nav a[data-tab="groups"]').click()
    groups = _wait(lambda: _css(browser, "#groups-box .group"))
    assert len(groups) == 5
    mixed = groups[-1].text
    assert "step 3" in mixed and "advantage 0.707" in mixed and "advantage -0.707" in mixed
    _assert_screenshot(browser, tmp_path / "groups.png")

    # a tiny-model member: swimlanes, then the loss-mask overlay on its tokens
    groups[0].find_element("css selector", ".member a").click()
    _wait(lambda: [e for e in _css(browser, "#lanes") if e.is_displayed()])
    index = int(browser.current_url.rsplit("/", 1)[1])
    rows = [Trajectory.model_validate_json(line) for f in sorted((training_run / "rollouts").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    traj = rows[index]
    assert traj.token_ids
    assert not _css(browser, "#token-overlay")  # drawn only when asked for
    browser.find_element("id", "show-tokens").click()
    trained = _wait(lambda: _css(browser, "#token-overlay .tk.m1"))
    assert len(trained) == sum(traj.loss_mask)
    tokenizer, _ = find_tokenizer(training_run)
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert browser.execute_script(
        "return [...document.querySelectorAll('#token-overlay .tk.m1')].map(e => e.textContent).join('')"
    ) == "".join(tokenizer.decode([t], skip_special_tokens=False) for t in sampled)
    stats = browser.find_element("css selector", ".token-stats").text
    assert f"{len(traj.token_ids)} tokens, {sum(traj.loss_mask)} with loss mask 1" in stats
    _assert_screenshot(browser, tmp_path / "tokens.png")
    _no_console_errors(browser)


def test_muarl_view_from_a_working_directory_through_a_symlink(browser, training_run, tmp_path):
    """``muarl view`` as a user runs it: a relative run directory that is a symlink, the page written elsewhere;
    the page opens on the run's curves and every local link resolves."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "grpo").symlink_to(training_run)
    done = run_muarl("view", "runs/grpo", "--out", "pages/grpo.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    _open(browser, tmp_path / "pages" / "grpo.html")
    assert _wait(lambda: [e for e in _css(browser, "#sec-overview #headline svg.chart") if e.is_displayed()])
    assert_local_links_resolve(browser)
    _no_console_errors(browser)
