"""What many test modules share: CI's rule for missing requirements, the retail domain, and the ways a test
plays an episode or runs the ``muarl`` command (import them with ``from conftest import ...``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from muarl.domain import Domain, get_domain
from muarl.policies.base import Policy
from muarl.policies.expert import ExpertPolicy
from muarl.rollout import EpisodeConfig, RolloutEngine, run_episode
from muarl.types import Task, Trajectory
from muarl.users.scripted import ScriptedUser


def under_ci() -> bool:
    """Whether the tests run as CI (``CI`` set, as CI services and ``.ci/run`` do; ``0``/``false`` is unset)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(available: bool, reason: str) -> None:
    """Skip the calling test or module when what it needs (a package, a data set) is not here, except under
    CI, where that fails it: a test that cannot run must not let CI pass as if it had.

    For what CI is meant to provide (``bash scripts/install.sh --dev`` and the data it expects). A test
    that is legitimately not for this environment (vLLM present or absent, a GPU) skips with
    ``pytest.skip``."""
    __tracebackhide__ = True  # pytest reports the caller's line, not this one
    if available:
        return
    if under_ci():
        pytest.fail(f"{reason} (CI is set: a test that cannot run fails)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(autouse=True)
def short_link_timeout(monkeypatch):
    """A weight link opened in a test fails a broadcast that cannot complete in 60 s, not the link's 600 s: a
    sender and a receiver that disagree on the bytes wait for each other until the timeout, and a broken sync
    would hold CI for ten minutes a test (the servers take the timeout from the trainer's end)."""
    from muarl.weight_sync import link

    monkeypatch.setattr(link, "LINK_TIMEOUT_S", 60.0)


@pytest.fixture(scope="session")
def retail() -> Domain:
    return get_domain("retail")


def play_episode(domain: Domain, task: Task, policy: Policy | None = None, seed: int = 0) -> Trajectory:
    """One episode of ``task``: the expert (or ``policy``) against the scripted user, required outputs checked."""
    return asyncio.run(run_episode(domain, task, policy or ExpertPolicy(), ScriptedUser(), seed=seed,
                                   config=EpisodeConfig(require_outputs=True)))


def play_tasks(domain: Domain, tasks: Sequence[Task], policy: Policy | None = None, max_turns: int | None = None,
               concurrency: int = 64) -> list[Trajectory]:
    """One episode per task, the expert (or ``policy``) against the scripted user, through the rollout engine."""
    config = EpisodeConfig() if max_turns is None else EpisodeConfig(max_turns=max_turns)
    engine = RolloutEngine(domain, policy or ExpertPolicy(), ScriptedUser(), config, concurrency=concurrency,
                           progress=False)
    return [group[0] for group in asyncio.run(engine.run(list(tasks)))]


def run_muarl(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
              timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``python -m muarl ARGS`` in a fresh process, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "muarl", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def muarl_console(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """The installed ``muarl`` console script run in ``cwd`` without ``$PYTHONPATH``, so only the cwd can
    provide a plug-in (what a user who pip-installed muarl gets)."""
    exe = shutil.which("muarl")
    assert exe, "the muarl console script is not installed"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
