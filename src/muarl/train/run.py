"""A training run's directory: fresh start or resume, the recorded config, seeding.

Resuming is automatic (``resume=None``): when ``out`` holds a complete checkpoint, the run continues from
the newest one, so re-running the command that was interrupted is all it takes. The checkpoint resumed
from is the newest *intact* one (its files match its manifest); newer damaged ones are named, with the
file that is wrong, and moved aside, and a run whose checkpoints are all damaged stops with the reason
(see :func:`muarl.train.checkpoint.choose_resume`). ``resume=True`` insists on a checkpoint (an error when
there is none); ``resume=False`` starts over and deletes the old checkpoints. A resume refuses a config that differs from the recorded one in anything that changes what
the steps compute (model, data, domain, learning rate, seeds ...), naming the fields; only the fields in
:data:`MAY_CHANGE` (more steps, saving, trackers, the micro-batch size, how weights are sharded) may
differ, and the address of an endpoint (a vLLM server or an LLM user restarted elsewhere, serving the
same model name), and the device within its kind (another GPU).

A run records what produced it in ``provenance.json`` at its start, as an evaluation does in its
results: muarl's version and commit, the versions of the packages that compute a step (torch,
transformers, peft, accelerate), the specs as given (model, data, domain, user), and digests of what the
run reads (:func:`data_digests` of SFT's data, a domain's provenance record, :func:`model_digests` of
the starting checkpoint). A spec that names the same path can hide other contents, so a resume also
refuses inputs whose digests changed, naming the field (``data./path``, ``model.model.safetensors``);
other package versions are only a warning, since refusing every resume after an upgrade would cost more
than the small numeric drift it avoids.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import muarl
from muarl.files import atomic_write, sha256_of
from muarl.provenance import flatten, muarl_commit, package_version
from muarl.train.checkpoint import checkpoints_dir, choose_resume, remove_partial, set_aside
from muarl.train.distributed import Dist

if TYPE_CHECKING:
    from muarl.models import ModelFiles

#: config fields a resumed run may change without changing what the remaining steps compute
MAY_CHANGE = {"steps", "epochs", "out", "resume", "save_every", "keep_checkpoints", "report_to", "micro_batch_size",
              "merge_lora", "progress",
              # how a vLLM engine shares the GPU, not what it samples
              "vllm_gpu_memory", "vllm_sleep", "vllm_sync_dir", "vllm_weight_sync",
              # time limits only decide when a stuck party faults its episode (raise one after spurious faults)
              "user_timeout", "agent_timeout", "tool_timeout", "user_http_timeout",
              # where a sharded run keeps its optimizer state, not what the steps compute. Not fsdp itself: a
              # sharded run's checkpoints hold shards (any number of ranks reads them), an unsharded one's do not
              "fsdp_offload"}


def _device_kind(value: str | None) -> str:
    """A ``--device`` as a resume compares it: its kind (``cuda:1`` is ``cuda``; unset is what this machine
    would pick), so a run resumes on another GPU of the same kind, but not across CPU and GPU, whose numbers
    differ."""
    if value is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return torch.device(value).type
    except (RuntimeError, ValueError):
        return str(value)


def _comparable(key: str, value: Any) -> Any:
    """A config value as a resume compares it: the device by its kind (:func:`_device_kind`); an endpoint
    spec's (``KIND:URL#MODEL``: ``--rollout-engine vllm-server:...``, ``--user llm:...``) address is where its
    model is served, not what it samples, so a server restarted on another port or machine resumes the run;
    its kind and model name must stay, and so must the number of servers of a comma-separated list
    (``vllm-server:URL1#M,URL2#M``)."""
    if key == "device":
        return _device_kind(value)
    if isinstance(value, str) and "://" in value and "#" in value:
        from muarl.factory import SpecError, split_endpoint

        kind = value.split(":", 1)[0]
        try:
            models = [split_endpoint(f"{kind}:{piece}", "endpoint")[1] for piece in value.split(":", 1)[1].split(",")]
        except SpecError:
            return value
        return f"{kind}:" + ",".join(f"URL#{model}" for model in models)
    return value


#: what a training run read, recorded at its start: muarl's version and commit, its inputs' digests
PROVENANCE = "provenance.json"
#: config fields recorded as the run's specs, as given (the fields that name what is trained, and by whom)
SPECS = ("model", "data", "domain", "domains", "user", "split", "rollout_engine")
#: packages whose versions a step's numbers depend on
PACKAGES = ("torch", "transformers", "peft", "accelerate")
#: model files larger than this are digested from samples (:func:`file_digest`), not read whole
WHOLE_DIGEST_BYTES = 1 << 30


@dataclass
class Run:
    """Where a run writes, the checkpoint it resumes from (None on a fresh start), and the files of the
    model it starts from, located once here (None without a ``model``, or when its spec names no model:
    the run's own load then says why) for everything below to load or serve."""

    out: Path
    resume_from: Path | None
    start_step: int
    model: ModelFiles | None = None


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
    check_shared_out(out, dist)
    if resume is not None and (out / "config.json").exists():
        current = asdict(config)
        # a field added to the config after the run was recorded had its default value then
        recorded = {**_defaults(config), **json.loads((out / "config.json").read_text())}
        differ = sorted(k for k in set(recorded) | set(current)
                        if k not in MAY_CHANGE and _comparable(k, recorded.get(k)) != _comparable(k, current.get(k)))
        if differ:
            detail = "; ".join(f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in differ)
            raise ValueError(f"{out} holds a run with another config ({detail}); resuming it would not reproduce "
                             "that run. Use another --out, or --no-resume to start over (deletes its checkpoints)")
    model_spec = getattr(config, "model", None)
    located: ModelFiles | OSError | ValueError | None = None
    if model_spec:  # after the config check: a refused resume builds nothing
        if dist.main:  # first: a cached alias (tiny-random, smollm2) is built once, not per rank
            located = _located(model_spec)
        dist.barrier()
        if not dist.main:
            located = _located(model_spec)
        inputs.setdefault("model", model_digests(located) if not isinstance(located, Exception)
                          else {"error": str(located)})
    record = provenance_record(config, inputs, located)
    if resume is not None and (out / PROVENANCE).exists():  # a run recorded before provenance.json: not checked
        before = json.loads((out / PROVENANCE).read_text())
        recorded = before.get("inputs", {})
        # an input recorded only since a later muarl (the model's digests, a built-in domain's) was not
        # checked then: not now
        then = flatten({k: v for k, v in recorded.items() if k in inputs})
        now = flatten(json.loads(json.dumps({k: v for k, v in inputs.items() if k in recorded})))
        changed = [f"{k}: {_short(then.get(k))} -> {_short(now.get(k))}" for k in sorted(set(then) | set(now))
                   if then.get(k) != now.get(k) and not _recorded_empty(recorded, k)]
        if changed:
            raise ValueError(f"{out} holds a run whose inputs changed since it started ({'; '.join(changed)}); "
                             "resuming it would not reproduce that run. Restore them, use another --out, or "
                             "--no-resume to start over (deletes its checkpoints)")
        drift = _version_drift(before, record)
        if drift and dist.main:
            sys.stderr.write(f"muarl: warning: {out} was started with other versions ({drift}); resuming, but its "
                             "remaining steps may differ slightly from an uninterrupted run's\n")
    if dist.main:
        (out / "config.json").write_text(json.dumps(asdict(config), indent=1) + "\n")
        write_config_yaml(out / "config.yaml", config)
        if resume is None:
            (out / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")
    dist.barrier()
    torch.manual_seed(config.seed)
    return Run(out, resume[1] if resume else None, resume[0] if resume else 0,
               None if isinstance(located, Exception) else located)


def check_shared_out(out: Path, dist: Dist) -> None:
    """Every rank sees ``out`` (a run of several nodes needs it on storage they share: rank 0 writes the
    results, every rank its checkpoint shards and reads the others' to resume), or one clear error on every
    rank naming those that do not, before any weight is loaded. Rank 0 leaves a marker there; each rank looks
    for it. A collective; nothing for one process."""
    import socket
    import uuid

    if dist.world == 1:
        return
    marker = out / f".muarl-shared-{dist.gather(uuid.uuid4().hex if dist.main else None)[0]}"
    if dist.main:
        marker.write_text("")
    dist.barrier()
    seen = dist.gather((marker.is_file(), socket.gethostname()))
    dist.barrier()
    if dist.main:
        marker.unlink(missing_ok=True)
    blind = [f"rank {rank} on {host}" for rank, (found, host) in enumerate(seen) if not found]
    if blind:
        raise ValueError(f"{', '.join(blind)} cannot see --out {out} that rank 0 on {seen[0][1]} writes: a run of "
                         "several nodes needs its output directory on storage every node shares (the same path "
                         "on each)")


def write_config_yaml(path: Path, config: Any) -> None:
    """The run's resolved settings, every field of its config, as the YAML that ``--config`` reads: the
    same command with ``--config`` this file reruns the run (:mod:`muarl.cli.config_file`)."""
    import yaml

    fields = json.loads(json.dumps(asdict(config)))  # tuples as lists, paths as text: what the options take
    command = type(config).__name__.removesuffix("Config").lower()  # GRPOConfig: muarl grpo
    header = (f"# the resolved settings of the run in this directory; rerun it with\n"
              f"#   muarl {command} --config {path} [--out ANOTHER_DIR]\n")
    atomic_write(path, header + yaml.safe_dump(fields, sort_keys=False, default_flow_style=False))


def _recorded_empty(recorded: dict[str, Any], key: str) -> bool:
    """Whether the flattened ``key``'s top-level input was recorded empty (``domain: {}`` by a muarl that kept
    no digests of a built-in domain): its digests now are new, not changed."""
    top = key.split(".", 1)[0]
    return recorded.get(top) in ({}, None)


def provenance_record(config: Any, inputs: dict[str, Any],
                      located: ModelFiles | OSError | ValueError | None = None) -> dict[str, Any]:
    """What ``provenance.json`` holds: muarl's version and commit, the packages' versions, the config's
    specs as given (:data:`SPECS`), the starting model's location (``located``: its files, or why they
    were not found; looked up here when not given), and ``inputs`` (the digests a resume checks)."""
    specs = {name: getattr(config, name) for name in SPECS if getattr(config, name, None) not in (None, "", [])}
    record: dict[str, Any] = {
        "muarl": {"version": muarl.__version__, "commit": muarl_commit()},
        "packages": {"python": platform.python_version(),
                     **{name: package_version(name)["version"] for name in PACKAGES}},
        "specs": specs,
    }
    if specs.get("model"):
        files = located if located is not None else _located(specs["model"])
        if isinstance(files, Exception):  # the run's own load says so, in its words; the record notes it
            record["model"] = {"spec": specs["model"], "error": str(files)}
        else:
            record["model"] = {"spec": specs["model"], "path": str(files.root),
                               "adapters": [str(a) for a in files.adapters]}
    return {**record, "inputs": inputs}


def _version_drift(before: dict[str, Any], now: dict[str, Any]) -> str:
    """The versions (muarl's and the packages') that differ between two records, one ``field: a -> b`` each;
    a field the older record lacks is not a difference."""
    then = flatten({k: before[k] for k in ("muarl", "packages") if k in before})
    current = flatten({k: now[k] for k in ("muarl", "packages")})
    return "; ".join(f"{k}: {then[k]} -> {current.get(k)}" for k in sorted(then) if then[k] != current.get(k))


def _located(spec: str) -> ModelFiles | OSError | ValueError:
    """The files of a model spec (:func:`muarl.models.locate`), or why there are none (recorded; the run's
    own load raises it)."""
    from muarl.models import locate

    try:
        return locate(spec)
    except (OSError, ValueError) as err:
        return err


def model_digests(spec: str | ModelFiles) -> dict[str, str]:
    """``{file: digest}`` of the checkpoint a run starts from (and of each LoRA adapter on it, as
    ``adapter<i>/file``): the files a load reads (configs, tokenizer, weights). Paths are left out (an
    alias's directory depends on where muarl is installed); the contents are what a resume must find
    again. A spec that cannot be resolved records ``{"error": ...}`` and leaves the error to the load."""
    files = _located(spec) if isinstance(spec, str) else spec
    if isinstance(files, Exception):
        return {"error": str(files)}
    adapters, root = files.adapters, files.root
    digests: dict[str, str] = {}
    for prefix, folder in [("", root), *((f"adapter{i}/", a) for i, a in enumerate(adapters))]:
        for path in sorted(Path(folder).iterdir()):
            if path.is_file() and path.suffix in (".json", ".safetensors", ".bin", ".model", ".txt", ".jinja",
                                                  ".tiktoken"):
                digests[prefix + path.name] = file_digest(path)
    return digests


def file_digest(path: Path) -> str:
    """The sha256 of a file; for one over :data:`WHOLE_DIGEST_BYTES` (a large model's weights), the sha256
    of its size and 64 evenly spaced 1 MiB blocks (first and last included), marked ``sampled:``: training
    changes every block of a checkpoint, so a sample finds a retrained model without reading tens of GB at
    every start."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= WHOLE_DIGEST_BYTES:
            return sha256_of(f)
        block, blocks = 1 << 20, 64
        h = hashlib.sha256(str(size).encode())
        for i in range(blocks):
            f.seek((size - block) * i // (blocks - 1))
            h.update(f.read(block))
    return "sampled:" + h.hexdigest()


def data_digests(paths: list[str]) -> dict[str, str]:
    """``{path: sha256 of its contents}`` for the data files a run reads (a missing one: "missing", so that
    the run's own clear error about it comes first)."""
    digests = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                digests[str(path)] = sha256_of(f)
        except OSError:
            digests[str(path)] = "missing"
    return digests


def _short(value: Any) -> str:
    """A recorded value for a one-line message: digests cut to 12 characters, absent ones as "-"."""
    if value is None:
        return "-"
    text = str(value)
    head, _, digest = text.rpartition(":")  # "sampled:<sha256>" keeps its mark
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return (f"{head}:" if head else "") + digest[:12] + "..."
    return repr(value)


def _defaults(config: Any) -> dict[str, Any]:
    """The default value of every config field that has one, JSON-shaped like a recorded config."""
    out = {}
    for f in fields(config):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out))


def computed(out: Path) -> dict[str, Any]:
    """What a finished GRPO run in ``out`` computed, in a form two runs of one command can be compared by:
    every step's metrics but the measured ones (:func:`muarl.time_split.is_timing`), every step's episodes
    (tokens, sampled log-probs, rewards, advantages) and the SHA-256 of the final weights
    (``scripts/repeat_runs.py``, ``tests/test_reproducible_runs.py``)."""
    from muarl.time_split import is_timing

    metrics = [{k: v for k, v in json.loads(line).items() if not is_timing(k)}
               for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = {path.name: [(e["token_ids"], e["logprobs"], e["reward"]["reward"], e["metadata"]["advantage"])
                            for e in map(json.loads, path.read_text().splitlines())]
                for path in sorted((out / "rollouts").glob("step_*.jsonl"))}
    with (out / "model" / "model.safetensors").open("rb") as weights:
        return {"metrics": metrics, "episodes": episodes, "weights": sha256_of(weights)}
