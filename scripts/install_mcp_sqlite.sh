#!/usr/bin/env bash
# Install mcp-server-sqlite, a stateful third-party MCP server from PyPI, into a virtualenv of its own
# (issue 33): the test that grades an MCP domain by the server's state runs it from there.
#   bash scripts/install_mcp_sqlite.sh           venv at $MUARL_MCP_SQLITE_VENV, by default in the user's
#                                                cache directory: ${XDG_CACHE_HOME:-~/.cache}/muarl/mcp-sqlite-venv
#   bash scripts/install_mcp_sqlite.sh --where   prints where the venv is (or would be), installs nothing
# Then the server is "$(bash scripts/install_mcp_sqlite.sh --where)/bin/mcp-server-sqlite".
#
# Why a venv of its own: mcp-server-sqlite 2025.4.25 is written against the MCP SDK 1.x (mcp.server's
# decorators), while muarl depends on the SDK 2.x; its declared requirement (mcp[cli]>=1.6.0) would take
# 2.x and fail at start. So it runs from its own environment with the SDK pinned below 2, which is also
# how a user runs any server that needs other versions than muarl's (docs/mcp.md). Idempotent: a venv
# whose server already has the wanted versions is left as it is (a second run takes about a second).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MUARL_MCP_SQLITE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/muarl/mcp-sqlite-venv}"
case "${1:-}" in
  --where) echo "$VENV"; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/install_mcp_sqlite.sh [--where]" >&2; exit 2 ;;
esac
SERVER="mcp-server-sqlite==2025.4.25"
SDK="mcp[cli]==1.30.0"
BASE_PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_mcp_sqlite: creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PY" -m venv "$VENV"
fi
have="$("$VENV/bin/python" - 2>/dev/null <<'EOF' || true
import importlib.metadata as m
print(m.version("mcp-server-sqlite"), m.version("mcp"))
EOF
)"
if [[ "$have" == "${SERVER#*==} ${SDK#*==}" && -x "$VENV/bin/mcp-server-sqlite" ]]; then
  echo "install_mcp_sqlite: $SERVER with mcp ${SDK#*==} already installed in $VENV"
  exit 0
fi
# pip's log goes to stderr only on failure: its index warnings are noise on a successful install
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "$VENV/bin/python" -m pip install --quiet "$SERVER" "$SDK" >"$log" 2>&1; then
  cat "$log" >&2
  echo "install_mcp_sqlite: error: could not install $SERVER and $SDK into $VENV" >&2
  exit 1
fi
"$VENV/bin/python" -c "import mcp_server_sqlite.server" || {
  echo "install_mcp_sqlite: error: mcp_server_sqlite does not import in $VENV" >&2; exit 1; }
echo "install_mcp_sqlite: $SERVER (mcp ${SDK#*==}) ready in $VENV"
