#!/usr/bin/env bash
# Runs the official MCP conformance suite (server scenarios) against `tpu-mcp http --no-auth` on
# loopback, for one protocol era: CONFORMANCE_ERA=2025-11-25 (the default; baseline
# test/hardening/conformance-baseline.yml) or 2026-07-28 (the revision's frozen requirements;
# baseline test/hardening/conformance-baseline-2026.yml). Both eras are served by one endpoint.
# The suite needs Node 22: scripts/lib/node22.sh installs a private one and the suite once; the
# server itself runs on the Node that runs this script. Exit status: the suite's (0 = no
# unexpected result).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFORMANCE_VERSION="${CONFORMANCE_VERSION:-0.2.0-alpha.12}"
ERA="${CONFORMANCE_ERA:-2025-11-25}"
OUT="${CONFORMANCE_OUT:-$ROOT/test/hardening/.results/conformance}"
if [[ "$ERA" == "2026-07-28" ]]; then
  BASELINE="$ROOT/test/hardening/conformance-baseline-2026.yml"
  SELECT=(--requirements "$ERA")
else
  BASELINE="$ROOT/test/hardening/conformance-baseline.yml"
  SELECT=(--spec-version "$ERA")
fi
# shellcheck source=lib/node22.sh
source "$ROOT/scripts/lib/node22.sh"
node22_tool conformance @modelcontextprotocol/conformance "$CONFORMANCE_VERSION"
SUITE="$TOOL_DIR/dist/index.js"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/tpu-mcp-conformance-XXXXXX")"
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

cat > "$TMP/config.json" <<JSON
{ "data_dir": "$TMP/data", "log_level": "warn",
  "runtime": { "device": "cpu", "start": "lazy" } }
JSON
node "$ROOT/bin/tpu-mcp.js" http --no-auth --host 127.0.0.1 --port 0 --config "$TMP/config.json" 2> "$TMP/server.log" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 300); do
  URL="$(sed -n 's/.*serving MCP (Streamable HTTP) at \([^ ]*\).*/\1/p' "$TMP/server.log" | head -n1)"
  [[ -n "$URL" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$TMP/server.log" >&2; echo "conformance: the server exited" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$URL" ]] || { cat "$TMP/server.log" >&2; echo "conformance: the server did not start" >&2; exit 1; }
echo "conformance: server at $URL" >&2

rm -rf "$OUT"
mkdir -p "$OUT"
set +e
"$NODE22" "$SUITE" server --url "$URL" "${SELECT[@]}" --expected-failures "$BASELINE" -o "$OUT" "$@"
STATUS=$?
set -e
exit "$STATUS"
