"""`python -m tpu_worker.fleet.probe ADDRESS`: does this Ray cluster let anyone in?

Run by the driver in a child process with a random token (Ray reads the token once per process,
so the check cannot share the driver's). One GCS call: if it succeeds, the cluster does not check
tokens and anyone who reaches its ports can run code there. Prints one word: `open`, `refused`
(the cluster checks tokens) or `unreachable` (with the reason after a space).
"""

from __future__ import annotations

import sys

PROBE_TIMEOUT_S = 10


def check(address: str) -> str:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=address).internal_kv_get(b"tpu-mcp-probe", None, timeout=PROBE_TIMEOUT_S)
    except AuthenticationError:
        return "refused"
    except Exception as exc:  # noqa: BLE001 - any other failure means we could not tell
        return f"unreachable {type(exc).__name__}: {exc}"
    return "open"


if __name__ == "__main__":
    print(check(sys.argv[1]).replace("\n", " ")[:500], flush=True)
