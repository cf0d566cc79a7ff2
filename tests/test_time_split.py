"""Where an episode's and a step's time goes (issue 59, item 1: muarl.time_split).

Real episodes with a policy and a user whose turns take known times (awaited sleeps: the latency of an
engine or of an LLM user's server), then a real GRPO run whose metrics and run page (headless Chromium)
carry the split.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from muarl.domain import get_domain
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rollout import EpisodeConfig, RolloutEngine
from muarl.time_split import EpisodeClock, busy_seconds, summarize
from muarl.types import Message, ToolCall
from muarl.users.base import UserReply, UserSession, UserSimulator
from test_viewer_browser import _assert_screenshot, _css, _open, _wait, browser  # noqa: F401 (a fixture)

POLICY_S, USER_S = 0.06, 0.15


class SlowAgent(Policy):
    """Thinks (one call to the domain's ``think`` tool), then speaks; each turn takes ``POLICY_S``."""

    name = "slow-agent"

    def session(self, domain, task, seed=None) -> PolicySession:
        return _SlowTurns()


class _SlowTurns(PolicySession):
    def __init__(self) -> None:
        self.turn = 0

    async def next(self, new_messages):
        await asyncio.sleep(POLICY_S)
        self.turn += 1
        if self.turn % 2:
            call = ToolCall(id=f"c{self.turn}", name="think", arguments={"thought": "check the order"})
            return AgentTurn(message=Message(role="assistant", content="", tool_calls=[call]))
        return AgentTurn(message=Message(role="assistant", content="Could you give me your order id?"))

    def close(self):
        return {}


class SlowUser(UserSimulator):
    """Answers after ``USER_S``; stops at its third reply."""

    name = "slow-user"

    def session(self, task, seed) -> UserSession:
        return _SlowReplies()


class _SlowReplies(UserSession):
    def __init__(self) -> None:
        self.replies = 0

    async def start(self):
        await asyncio.sleep(USER_S)
        return UserReply("Hi, I need help with an order.")

    async def reply(self, agent_text, act):
        await asyncio.sleep(USER_S)
        self.replies += 1
        return UserReply("It is #W0000000.", stop="stop" if self.replies == 3 else None)


def _episodes(n: int) -> list:
    domain = get_domain("retail")
    engine = RolloutEngine(domain, SlowAgent(), SlowUser(), EpisodeConfig(max_turns=20), group_size=n,
                           progress=False)
    return [t for g in asyncio.run(engine.run(domain.tasks("train")[:1])) for t in g]


def test_an_episode_splits_its_time_between_the_parties_it_waited_on():
    """An episode of 6 agent turns (3 of them a tool call) and 4 user turns: its policy and user seconds
    are at least the sleeps they awaited and the rest stays small; every call is one span; the parts and
    waiting add up to the episode's wall time."""
    (traj,) = _episodes(1)
    time = traj.metadata["time"]
    assert traj.stop_reason == "user_stop" and traj.turns == 6
    spans = time["spans"]
    assert len(spans["policy"]) == 6 and len(spans["user"]) == 4 and len(spans["tools"]) == 3
    assert len(spans["grading"]) == 1
    assert 6 * POLICY_S <= time["policy_s"] < 6 * POLICY_S + 1.0, time
    assert 4 * USER_S <= time["user_s"] < 4 * USER_S + 1.0, time
    parts = time["policy_s"] + time["user_s"] + time["tools_s"] + time["grading_s"] + time["waiting_s"]
    assert parts == pytest.approx(time["episode_s"], abs=1e-4)
    for part, part_spans in spans.items():  # in order, inside the episode, none overlapping another
        assert all(0 <= a <= b <= time["episode_s"] + 1e-6 for a, b in part_spans), part
    every = sorted(span for part_spans in spans.values() for span in part_spans)
    assert all(one[1] <= two[0] + 1e-6 for one, two in zip(every, every[1:], strict=False)), every


def test_concurrent_episodes_overlap_their_waits_and_the_batch_says_how_busy_each_party_was():
    """Four episodes at once: each spends about as long on its user as one alone, but the batch's wall
    time does not add them up: the user's busy share (union of the spans) is below the sum of the
    episodes' user seconds over the wall time, and no share exceeds 1."""
    trajs = _episodes(4)
    split = summarize(trajs)
    wall = split["split_wall_s"]
    user_total = sum(t.metadata["time"]["user_s"] for t in trajs)
    assert split["split_user_s"] >= 4 * USER_S
    assert 0 < split["split_user_busy"] <= 1 and split["split_user_busy"] * wall < user_total
    assert wall < sum(t.metadata["time"]["episode_s"] for t in trajs)
    shares = [split[f"split_{p}_share"] for p in ("policy", "user", "tools", "grading", "waiting")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)


def test_a_device_tool_inside_a_user_turn_is_the_tools_time_not_the_users():
    """The clock pauses a user turn for a tool call made inside it (a dual-control user's device action)
    and resumes it after: no second is counted twice."""
    import time as clock

    c = EpisodeClock()
    c.enter("user")
    clock.sleep(0.05)
    c.enter("tools")
    clock.sleep(0.1)
    c.leave("tools")
    clock.sleep(0.05)
    c.leave("user")
    record = c.record()
    assert 0.1 <= record["tools_s"] < 0.15 and 0.1 <= record["user_s"] < 0.15, record
    assert len(record["spans"]["user"]) == 2 and record["spans"]["user"][0][1] <= record["spans"]["tools"][0][0]


def test_busy_seconds_is_the_length_of_the_union():
    assert busy_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)
    assert busy_seconds([]) == 0


@pytest.mark.slow
def test_a_grpo_run_logs_the_split_and_its_page_stacks_each_steps_seconds(browser, tmp_path):  # noqa: F811
    """Two GRPO steps of the tiny preset: every step's metrics hold the rollouts' split (the engine's
    queue, prefill and decode among it) and the trainer's phases; the run page draws one stacked bar per
    step whose segments are those seconds, in Chromium."""
    from muarl.report import build_report
    from muarl.time_split import step_seconds

    out = tmp_path / "grpo"
    done = subprocess.run([sys.executable, "-m", "muarl", "grpo", "--preset", "tiny", "--out", str(out), "--steps",
                           "2", "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "16",
                           "--max-turns", "3", "--no-progress", "--report-to", "none"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        assert m["split_policy_s"] > 0 and m["policy_tokens_per_s"] > 0, m
        assert m["split_policy_queue_s"] + m["split_policy_prefill_s"] + m["split_policy_decode_s"] <= \
            m["split_policy_s"] + 1e-3
        assert m["backward_s"] > 0 and m["optimizer_s"] > 0 and m["scoring_s"] > 0
    page = build_report(out, tmp_path / "run.html")
    _open(browser, page)
    browser.find_element("css selector", 'nav a[data-tab="training"]').click()
    bars = _wait(lambda: [e for e in _css(browser, "#sec-training svg.chart")
                          if e.get_attribute("aria-label") == "where a step's seconds went" and e.is_displayed()])
    titles = [r.get_attribute("textContent") for r in bars[0].find_elements("css selector", "rect title")]
    want = sum(sum(v > 0 for v in step_seconds(m).values()) for m in metrics)
    assert len(titles) == want and any(t.startswith("policy @ 1:") for t in titles), titles
    browser.execute_script("arguments[0].scrollIntoView()", bars[0])
    _assert_screenshot(browser, tmp_path / "split.png")
