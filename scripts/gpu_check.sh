#!/usr/bin/env bash
# The GPU check: muarl's engine on CUDA, GRPO and SFT steps under --fsdp with bf16 on one rank, --fsdp-offload;
# step time and peak GPU memory, one line each (scripts/gpu_check.py). Needs only PyTorch with CUDA,
# transformers, peft and accelerate besides muarl's own light dependencies; no vLLM, no downloads. About 5
# minutes on one H100. Run it whenever the `device` tool lends a machine and put its lines, with the GPU's
# name, in docs/gpu.md ("Measured on GPUs").
#   bash scripts/gpu_check.sh [--layers N] [--device cpu]      # --device cpu --layers 1: a dry run here
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
exec python scripts/gpu_check.py "$@"
