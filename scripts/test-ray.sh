#!/usr/bin/env bash
# The Ray suite: a real local Ray cluster (token auth, simulated TPU hosts) in a network namespace
# of its own that has only loopback, so Ray binds 127.0.0.1 and no packet leaves the machine.
# As root: `unshare -n`; otherwise a user namespace maps us to root inside it (`unshare -rn`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then flags=(-n); else flags=(-r -n); fi
exec unshare "${flags[@]}" -- bash -c 'ip link set lo up && exec "$@"' _ \
  .venv/bin/python -m pytest -q -p no:cacheprovider runtime/worker/tests_ray "$@"
