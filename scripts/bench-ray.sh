#!/usr/bin/env bash
# The Ray part of `npm run bench` (bench/ray.ts), in a network namespace with only loopback (see
# scripts/test-ray.sh). Skipped, with a note, when Ray is not installed (`npm start` users).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import ray" 2>/dev/null; then
  echo "[bench:ray] Ray is not installed (pip install -r runtime/worker/requirements-ray.txt); skipped" >&2
  exit 0
fi
if [ "$(id -u)" = 0 ]; then flags=(-n); else flags=(-r -n); fi
exec unshare "${flags[@]}" -- bash -c 'ip link set lo up && exec npx tsx bench/ray.ts'
