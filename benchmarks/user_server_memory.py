"""The LLM user's server's resident memory over many concurrent conversations: freed memory returned to the
system every few seconds (``--trim-every``, the default; ``muarl.allocator``) against glibc's defaults
(``--trim-every 0``).

Two ``python -m muarl.serve`` processes, one after the other, as the embedded user runs them (one thread, KV of
finished requests kept), are sent the same ``N`` conversations at once, turn by turn, over HTTP: muarl's user
prompt for the first ``N`` dev tasks of retail-lite-forgetful, the agent's lines canned, greedy replies of up to
``--max-tokens`` tokens. Each server's peak and final resident memory are read from ``/proc/PID/status``
(VmHWM, VmRSS); its replies are checked equal to the other's, so both did the same work.

    python benchmarks/user_server_memory.py                   # about 9 minutes on 2 cores
    python benchmarks/user_server_memory.py --model runs/user-sft/model --conversations 64

Last line: ``user server memory, glibc defaults vs returned: resident N.NNx, peak N.NNx``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).parent))
from muarl.domain import get_domain  # noqa: E402
from muarl.serve import stop_server, wait_ready  # noqa: E402
from muarl.users.llm import opening_messages  # noqa: E402
from user_conversations import AGENT_SAYS  # noqa: E402


def memory_gib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in GiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) / 2**20 for key in ("VmRSS", "VmHWM")}


async def converse(url: str, tasks: list, turns: int, max_tokens: int) -> list[list[str]]:
    """Every conversation's user lines, all conversations at once, one turn at a time."""
    histories = [opening_messages(t) for t in tasks]
    said: list[list[str]] = [[] for _ in tasks]
    async with AsyncOpenAI(base_url=url, api_key="none", timeout=3600, max_retries=0) as client:
        for turn in range(turns):
            replies = await asyncio.gather(*[client.chat.completions.create(
                model="user", messages=h, temperature=0.0, max_tokens=max_tokens) for h in histories])
            for n, reply in enumerate(replies):
                text = reply.choices[0].message.content or ""
                said[n].append(text)
                histories[n] += [{"role": "assistant", "content": text},
                                 {"role": "user", "content": AGENT_SAYS[turn % len(AGENT_SAYS)]}]
    return said


def serve_and_measure(args: argparse.Namespace, tasks: list, defaults: bool) -> tuple[list[list[str]], dict]:
    command = [sys.executable, "-m", "muarl.serve", "--model", args.model, "--served-name", "user", "--port", "0",
               "--threads", str(args.threads)] + (["--trim-every", "0"] if defaults else [])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        url = wait_ready(proc, 300)
        if url is None:
            raise SystemExit(f"the server did not start: {' '.join(command)}")
        began = time.perf_counter()
        said = asyncio.run(converse(url, tasks, args.turns, args.max_tokens))
        memory = {**memory_gib(proc.pid), "seconds": time.perf_counter() - began}
    finally:
        stop_server(proc)
    return said, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a checkpoint directory (a user model)")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (the embedded user's: 1)")
    args = parser.parse_args()
    tasks = get_domain("retail-lite-forgetful").tasks("dev")[:args.conversations]
    said, memory = {}, {}
    for name, defaults in (("glibc defaults", True), ("returned", False)):
        said[name], memory[name] = serve_and_measure(args, tasks, defaults)
        m = memory[name]
        print(f"{name}: resident {m['VmRSS']:.2f} GiB, peak {m['VmHWM']:.2f} GiB, {m['seconds']:.0f} s", flush=True)
    if said["glibc defaults"] != said["returned"]:
        raise SystemExit("the two servers' replies differ")
    base, new = memory["glibc defaults"], memory["returned"]
    print(f"user server memory, glibc defaults vs returned: resident {base['VmRSS'] / new['VmRSS']:.2f}x, "
          f"peak {base['VmHWM'] / new['VmHWM']:.2f}x")


if __name__ == "__main__":
    main()
