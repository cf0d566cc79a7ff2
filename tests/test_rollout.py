"""The episode loop and the rollout engine: stop reasons, fuzzed model output, interrupted runs."""

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from muarl.chat import parse_assistant
from muarl.domain import get_domain
from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rollout import EpisodeConfig, RolloutEngine, load_trajectories, run_episode, user_seed
from muarl.types import Message
from muarl.users.base import UserReply, UserSession, UserSimulator

ROOT = Path(__file__).resolve().parents[1]


class PoliteUser(UserSimulator):
    def __init__(self, replies: int = 1000):
        self.replies = replies

    def session(self, task, seed):
        return _Polite(self.replies)


class _Polite(UserSession):
    def __init__(self, replies):
        self.replies, self.n = replies, 0

    async def start(self):
        return UserReply("Hello, I need help.")

    async def reply(self, agent_text, act):
        self.n += 1
        return UserReply("Go on.", stop="stop" if self.n >= self.replies else None)


class TextPolicy(Policy):
    """Plays a fixed list of raw model outputs, parsed exactly as a token backend parses them."""

    def __init__(self, outputs):
        self.outputs = outputs

    def session(self, domain, task, seed=None):
        return _Text(list(self.outputs))


class _Text(PolicySession):
    def __init__(self, outputs):
        self.outputs, self.turn = outputs, 0

    async def next(self, new_messages):
        text = self.outputs[self.turn % len(self.outputs)]
        parsed = parse_assistant(text, f"call_{self.turn}")
        self.turn += 1
        return AgentTurn(message=Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls),
                         parse_errors=parsed.errors)


def _fuzz_outputs(rng: random.Random, tools: list[str]) -> list[str]:
    junk = ["", " ", "\u00e9\u4e2d\U0001f600\u202e", "x" * 20000, "{}", "null", "[1,2,3]", '{"a": 1}', "</tool_call>"]
    outs = []
    for _ in range(1000):
        kind = rng.randrange(7)
        name = rng.choice(tools + ["no_such_tool", "", "get_order_details; DROP TABLE"])
        if kind == 0:
            outs.append("<tool_call>" + rng.choice(junk) + "</tool_call>")
        elif kind == 1:
            outs.append(f'<tool_call>{{"name": "{name}", "arguments": {{"order_id": {rng.choice(["1", "null", "[]"])}}}}}</tool_call>')
        elif kind == 2:
            outs.append(f'<tool_call>{{"name": "{name}", "arguments": {json.dumps({"x" * rng.randint(1, 50): rng.random()})}}}</tool_call>')
        elif kind == 3:
            outs.append(f'<tool_call>{{"name": "{name}", "arguments": {{}}}}')  # unterminated
        elif kind == 4:
            outs.append(f'<tool_call>{{"name": "{name}", "arguments": "{{not json"}}</tool_call>')
        elif kind == 5:
            outs.append("".join(rng.choice(junk + ["<tool_call>", '"name"', ":"]) for _ in range(5)))
        else:
            outs.append(f'<tool_call>{{"name": "calculate", "arguments": {{"expression": "{rng.choice(["1/0", "2**99", "1+"])}"}}}}</tool_call>')
    return outs


def test_1000_malformed_outputs_never_crash_and_each_becomes_an_error_observation():
    rng = random.Random(0)
    errors = observations = 0
    for name in ("retail", "airline", "telecom"):
        domain = get_domain(name)
        outputs = _fuzz_outputs(rng, sorted(domain.agent_tools))
        tasks = domain.tasks("test")[:10]

        async def play_all(domain=domain, outputs=outputs, tasks=tasks):
            return await asyncio.gather(*[
                run_episode(domain, task, TextPolicy(outputs[i * 100:(i + 1) * 100]), PoliteUser(),
                            config=EpisodeConfig(max_turns=100)) for i, task in enumerate(tasks)])

        trajs = asyncio.run(play_all())
        for traj in trajs:
            assert traj.reward is not None and traj.stop_reason == "max_turns"
            for m in traj.messages:
                if m.role == "tool":
                    observations += 1
                    errors += m.content.startswith("Error:")
            # a malformed call is also a counted metric
            assert traj.malformed_calls > 0
    assert observations >= 1000 and errors >= 0.9 * observations


def test_malformed_output_can_end_the_episode_as_the_paper_does():
    domain = get_domain("retail")
    task = domain.tasks("test")[0]
    bad = TextPolicy(['<tool_call>{"name": oops}</tool_call>'])
    traj = asyncio.run(run_episode(domain, task, bad, PoliteUser(), config=EpisodeConfig(end_on_malformed=True)))
    assert traj.stop_reason == "malformed" and traj.malformed_calls == 1
    unknown = TextPolicy(['<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'])
    traj = asyncio.run(run_episode(domain, task, unknown, PoliteUser(), config=EpisodeConfig(end_on_malformed=True)))
    assert traj.stop_reason == "malformed"


def test_stop_reasons():
    domain = get_domain("retail")
    task = domain.tasks("test")[0]

    def play(outputs, user=None, **config):
        return asyncio.run(run_episode(domain, task, TextPolicy(outputs), user or PoliteUser(), config=EpisodeConfig(**config)))

    assert play(["How can I help?"], PoliteUser(2)).stop_reason == "user_stop"
    transfer = '<tool_call>{"name": "transfer_to_human_agents", "arguments": {"summary": "x"}}</tool_call>'
    assert play([transfer]).stop_reason == "transfer"
    traj = play(['<tool_call>{"name": "think", "arguments": {"thought": "hm"}}</tool_call>'], max_turns=5)
    assert traj.stop_reason == "max_turns" and traj.turns == 5
    # tool executions and user replies both count towards the turn limit
    mixed = play(['<tool_call>{"name": "think", "arguments": {"thought": "hm"}}</tool_call>', "Anything else?"],
                 max_turns=6)
    assert mixed.turns == 6 and sum(m.role == "user" for m in mixed.messages) == 1 + 3


def test_common_user_seed_per_group_and_independent_option():
    assert user_seed(0, "t", 0) == user_seed(0, "t", 0) != user_seed(0, "t", 1)
    domain = get_domain("retail")
    tasks = domain.tasks("test")[:2]
    for common in (True, False):
        engine = RolloutEngine(domain, TextPolicy(["Hi"]), PoliteUser(1), group_size=3, common_user_seed=common,
                               progress=False)
        groups = asyncio.run(engine.run(tasks))
        seeds = [[t.user_seed for t in g] for g in groups]
        assert all(len(set(s)) == (1 if common else 3) for s in seeds)
        assert [t.metadata["member"] for t in groups[0]] == [0, 1, 2]


def test_torn_last_line_is_ignored_and_closed(tmp_path):
    domain = get_domain("retail")
    tasks = domain.tasks("test")[:3]
    out = tmp_path / "t.jsonl"
    engine = RolloutEngine(domain, TextPolicy(["Hi"]), PoliteUser(1), out=out, progress=False)
    asyncio.run(engine.run(tasks[:2]))
    text = out.read_text()
    out.write_text(text + text.splitlines()[0][:50])  # a run killed in the middle of a write
    assert len(load_trajectories(out)) == 2
    groups = asyncio.run(engine.run(tasks))
    assert [g[0].task_id for g in groups] == [t.id for t in tasks]
    assert len(load_trajectories(out)) == 3 and out.read_text().count("\n") == 3  # the torn line was cut


def test_killed_rollout_keeps_finished_work_and_resumes(tmp_path):
    """SIGKILL a real `muarl rollout` mid-run; the rerun keeps every finished episode and adds the rest."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "muarl", "rollout", "--domain", "retail", "--policy", "hf:tiny", "--user",
           "scripted", "--limit", "12", "--concurrency", "1", "--max-new-tokens", "48", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = out / "trajectories.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not path.exists() or path.read_text().count("\n") < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = load_trajectories(path)
    assert 3 <= len(before) < 12
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = load_trajectories(path)
    assert len(after) == 12
    for key, traj in before.items():
        assert after[key].model_dump() == traj.model_dump()  # finished work is kept, not redone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 12


def test_sampling_depends_on_task_and_member_not_on_what_else_ran() -> None:
    """A resumed run plays only the missing episodes; each must sample what it would have sampled anyway."""
    from muarl.models import load
    from muarl.policies.hf import HFPolicy
    from muarl.users.scripted import ScriptedUser

    domain = get_domain("retail-lite")
    a, b = domain.tasks("test")[:2]
    model = load("tiny")
    config = EpisodeConfig(max_turns=3)

    def play(tasks: list) -> dict:
        policy = HFPolicy(model, temperature=1.0, max_new_tokens=24, seed=7)  # a fresh policy, as after a restart
        engine = RolloutEngine(domain, policy, ScriptedUser(), config, group_size=2, seed=3, progress=False)
        groups = asyncio.run(engine.run(tasks))
        return {(t.id, m): traj.token_ids for t, g in zip(tasks, groups, strict=True) for m, traj in enumerate(g)}

    both, alone = play([a, b]), play([b])
    assert both[(b.id, 0)] == alone[(b.id, 0)] and both[(b.id, 1)] == alone[(b.id, 1)]
    assert both[(b.id, 0)] != both[(b.id, 1)]  # group members still sample differently
