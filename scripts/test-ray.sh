#!/usr/bin/env bash
# The Ray suites: a real local Ray cluster (token auth, simulated TPU hosts) in a network namespace
# of its own that has only loopback, so Ray binds 127.0.0.1 and no packet leaves the machine.
# As root: `unshare -n`; otherwise a user namespace maps us to root inside it (`unshare -rn`).
# Runs the Python suite (runtime/worker/tests_ray), then the end-to-end one (test/ray).
# Extra arguments go to pytest; TPU_MCP_RAY_SUITE=py|e2e runs one of the two.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then flags=(-n); else flags=(-r -n); fi
suite="${TPU_MCP_RAY_SUITE:-all}"
# test/ray/shared_fleet.test.ts starts a PostgreSQL and HAProxy inside the namespace, which has no
# network: Debian's packages are installed here first when missing (as the Postgres suite does).
if [ "$suite" != py ]; then npx tsx --eval 'import setup from "./test/postgres/setup.ts"; setup();'; fi
exec unshare "${flags[@]}" -- bash -c '
  set -euo pipefail
  ip link set lo up
  suite="$1"; shift
  if [ "$suite" != e2e ]; then .venv/bin/python -m pytest -q -p no:cacheprovider runtime/worker/tests_ray "$@"; fi
  if [ "$suite" != py ]; then npx vitest run --config vitest.ray.config.ts; fi
' _ "$suite" "$@"
