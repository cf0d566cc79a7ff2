"""A training run's directory: fresh start or resume, the recorded config, seeding.

Resuming is automatic (``resume=None``): when ``out`` holds a complete checkpoint, the run continues from
the newest one, so re-running the command that was interrupted is all it takes. The checkpoint resumed
from is the newest *intact* one (its files match its manifest); newer damaged ones are named, with the
file that is wrong, and moved aside, and a run whose checkpoints are all damaged stops with the reason
(see :func:`muarl.train.checkpoint.choose_resume`). ``resume=True`` insists on a checkpoint (an error when
there is none); ``resume=False`` starts over and deletes the old checkpoints. A resume refuses a config that differs from the recorded one in anything that changes what
the steps compute (model, data, learning rate, seeds ...), naming the fields; only the fields in
:data:`MAY_CHANGE` (more steps, saving, trackers, the micro-batch size) may differ, and the address of an
endpoint (a vLLM server or an LLM user restarted elsewhere, serving the same model name).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

import muarl
from muarl.provenance import flatten, muarl_commit
from muarl.train.checkpoint import checkpoints_dir, choose_resume, remove_partial, set_aside
from muarl.train.distributed import Dist

#: config fields a resumed run may change without changing what the remaining steps compute
MAY_CHANGE = {"steps", "epochs", "out", "resume", "save_every", "keep_checkpoints", "report_to", "micro_batch_size",
              "merge_lora", "progress",
              # how a vLLM engine shares the GPU, not what it samples
              "vllm_gpu_memory", "vllm_sleep", "vllm_sync_dir",
              # time limits only decide when a stuck party faults its episode (raise one after spurious faults)
              "user_timeout", "agent_timeout", "tool_timeout", "user_http_timeout"}


def _comparable(value: Any) -> Any:
    """A config value as a resume compares it: an endpoint spec's (``KIND:URL#MODEL``: ``--rollout-engine
    vllm-server:...``, ``--user llm:...``) address is where its model is served, not what it samples, so a
    server restarted on another port or machine resumes the run; its kind and model name must stay."""
    if isinstance(value, str) and "://" in value and "#" in value:
        from muarl.factory import SpecError, split_endpoint

        try:
            _, model = split_endpoint(value, "endpoint")
        except SpecError:
            return value
        return f"{value.split(':', 1)[0]}:URL#{model}"
    return value


#: what a training run read, recorded at its start: muarl's version and commit, its inputs' digests
PROVENANCE = "provenance.json"


@dataclass
class Run:
    """Where a run writes, and the checkpoint it resumes from (None on a fresh start)."""

    out: Path
    resume_from: Path | None
    start_step: int


def open_run(config: Any, dist: Dist, inputs: dict[str, Any] | None = None) -> Run:
    """Decide fresh start or resume, check the config against the recorded one, record it, seed.

    ``inputs``: what the run reads beyond its config, as digests (:func:`data_digests`, a domain's
    provenance record). A fresh run writes them with muarl's version and commit to ``provenance.json``; a
    resume refuses inputs that changed since (the same path with other contents would not reproduce the
    run either), naming them, and leaves the checkpoints as they are."""
    inputs = dict(inputs or {})
    out = Path(config.out)
    mode = getattr(config, "resume", None)
    choice = choose_resume(out) if mode is not False else None  # verifies: raises when none is intact
    if mode is True and choice.found is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {checkpoints_dir(out)}")
    resume = choice.found if choice is not None else None
    dist.barrier()  # every rank has looked before rank 0 changes anything
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
        remove_partial(out)
        if choice is not None:
            set_aside(choice)
        if resume is None and mode is False and checkpoints_dir(out).exists():
            shutil.rmtree(checkpoints_dir(out))
    if resume is not None and (out / "config.json").exists():
        current = asdict(config)
        # a field added to the config after the run was recorded had its default value then
        recorded = {**_defaults(config), **json.loads((out / "config.json").read_text())}
        differ = sorted(k for k in set(recorded) | set(current)
                        if k not in MAY_CHANGE and _comparable(recorded.get(k)) != _comparable(current.get(k)))
        if differ:
            detail = "; ".join(f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in differ)
            raise ValueError(f"{out} holds a run with another config ({detail}); resuming it would not reproduce "
                             "that run. Use another --out, or --no-resume to start over (deletes its checkpoints)")
    if resume is not None and (out / PROVENANCE).exists():  # a run recorded before provenance.json: not checked
        then = flatten(json.loads((out / PROVENANCE).read_text()).get("inputs", {}))
        now = flatten(json.loads(json.dumps(inputs)))
        changed = [f"{k}: {_short(then.get(k))} -> {_short(now.get(k))}" for k in sorted(set(then) | set(now))
                   if then.get(k) != now.get(k)]
        if changed:
            raise ValueError(f"{out} holds a run whose inputs changed since it started ({'; '.join(changed)}); "
                             "resuming it would not reproduce that run. Restore them, use another --out, or "
                             "--no-resume to start over (deletes its checkpoints)")
    if dist.main:
        (out / "config.json").write_text(json.dumps(asdict(config), indent=1) + "\n")
        if resume is None:
            record = {"muarl": {"version": muarl.__version__, "commit": muarl_commit()}, "inputs": inputs}
            (out / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")
        if dist.world > 1 and hasattr(config, "model"):  # build a cached alias (tiny, smollm2) once, not per rank
            from muarl.models import checkpoint_root

            checkpoint_root(config.model)
    dist.barrier()
    torch.manual_seed(config.seed)
    return Run(out, resume[1] if resume else None, resume[0] if resume else 0)


def data_digests(paths: list[str]) -> dict[str, str]:
    """``{path: sha256 of its contents}`` for the data files a run reads (a missing one: "missing", so that
    the run's own clear error about it comes first)."""
    digests = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                digests[str(path)] = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            digests[str(path)] = "missing"
    return digests


def _short(value: Any) -> str:
    """A recorded value for a one-line message: digests cut to 12 characters, absent ones as "-"."""
    if value is None:
        return "-"
    text = str(value)
    return text[:12] + "..." if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else repr(value)


def _defaults(config: Any) -> dict[str, Any]:
    """The default value of every config field that has one, JSON-shaped like a recorded config."""
    out = {}
    for f in fields(config):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out))
