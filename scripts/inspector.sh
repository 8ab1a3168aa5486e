#!/usr/bin/env bash
# Runs the MCP Inspector's CLI (@modelcontextprotocol/inspector, the reference client) with the
# arguments given, for test/hardening/inspector.test.ts. The Inspector needs Node >= 22.19:
# scripts/lib/node22.sh installs a private one and the Inspector once. Secrets stay in memory
# (no keychain on CI machines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
INSPECTOR_VERSION="${INSPECTOR_VERSION:-2.12.0}"
# shellcheck source=lib/node22.sh
source "$ROOT/scripts/lib/node22.sh"
node22_tool inspector @modelcontextprotocol/inspector "$INSPECTOR_VERSION"
CLI="$TOOL_DIR/clients/cli/build/index.js"
export MCP_INSPECTOR_SECRET_STORE=memory
# The CLI runs only when started by its real path (it compares it with import.meta.url).
exec "$NODE22" "$(realpath "$CLI")" "$@"
