"""What MCP costs: tool-call latency and episode throughput over stdio and streamable HTTP vs in-process.

    python benchmarks/mcp_roundtrip.py [--tasks 16] [--calls 200]

Starts ``muarl serve-mcp retail`` over HTTP on a free port (and one stdio server per episode for the
stdio row), plays the expert against the scripted user on retail test tasks, and checks every episode
scores 1.0 with the same tool outputs as in process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time

from muarl.domain import get_domain
from muarl.mcp import ServerSpec, mcp_domain
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import RolloutEngine
from muarl.users.scripted import ScriptedUser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _episodes(domain, tasks):  # noqa: ANN001, ANN202
    start = time.perf_counter()
    engine = RolloutEngine(domain, ExpertPolicy(), ScriptedUser(), concurrency=len(tasks), progress=False)
    trajs = [g[0] for g in asyncio.run(engine.run(tasks))]
    return trajs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    retail = get_domain("retail")
    tasks = retail.tasks("test")[: args.tasks]
    local, local_s = _episodes(retail, tasks)
    port = _free_port()
    token = secrets.token_urlsafe(32)  # the control token: muarl grades with the server's own state hash
    server = subprocess.Popen([sys.executable, "-m", "muarl", "serve-mcp", "retail", "--transport", "http",
                               "--port", str(port)], stderr=subprocess.DEVNULL,
                              env={**os.environ, "MUARL_MCP_CONTROL_TOKEN": token})
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        rows = []
        for label, spec in (("http", ServerSpec(url=f"http://127.0.0.1:{port}/mcp", control_token=token)),
                            ("stdio", ServerSpec.muarl("retail"))):
            domain = mcp_domain(spec, base=retail)
            env = domain.env(tasks[0])
            order = next(iter(retail.database().tables["orders"]))
            env.call("get_order_details", {"order_id": order})  # opens the session (starts a stdio server)
            start = time.perf_counter()
            for _ in range(args.calls):
                env.call("get_order_details", {"order_id": order})
            per_call_ms = (time.perf_counter() - start) / args.calls * 1000
            env.close()
            trajs, seconds = _episodes(domain, tasks)
            same = all([(r.name, r.output) for r in a.tool_log] == [(r.name, r.output) for r in b.tool_log]
                       for a, b in zip(trajs, local, strict=True))
            success = sum(t.reward.reward for t in trajs) / len(trajs)
            rows.append((label, per_call_ms, len(trajs) / seconds, seconds, success, same))
    finally:
        server.terminate()
        server.wait(10)
    print(f"in-process: {len(local)} episodes in {local_s:.2f} s ({len(local) / local_s:.1f}/s), "
          f"success {sum(t.reward.reward for t in local) / len(local):.3f}")
    print("| transport | sync call latency (ms) | episodes/s | wall (s) | success | outputs identical |")
    print("|---|---|---|---|---|---|")
    for label, ms, eps, seconds, success, same in rows:
        print(f"| {label} | {ms:.2f} | {eps:.2f} | {seconds:.1f} | {success:.3f} | {same} |")


if __name__ == "__main__":
    main()
