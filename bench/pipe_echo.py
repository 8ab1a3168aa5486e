"""Pipe round trip without a model: the worker's own frame server, with an `echo` op.

Runs tpu_worker.server.Server (the real reader thread, op pool, frame encoder and writer) over
stdin/stdout, behind a stand-in Worker whose only op returns the request's tensors. The bench
spawns it through WorkerRuntime's `spawn` option, so both codecs on the path are production
code; only the op is the bench's. The real worker has no echo/identity op.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    # As tpu_worker.__main__: keep the real stdout for frames, send stray prints to stderr.
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    # Experiment switch (not a default): BENCH_SOCK_BUF=N sets N-byte kernel buffers on the
    # protocol channel (Node's "pipe" stdio is a Unix socketpair), to show how much of the cost
    # is ping-pong through the default ~208 KiB socket buffer.
    size = int(os.environ.get("BENCH_SOCK_BUF", "0"))
    if size:
        import socket

        for fd, opt in ((0, socket.SO_RCVBUF), (proto.fileno(), socket.SO_SNDBUF)):
            sock = socket.socket(fileno=os.dup(fd))
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
            sock.detach()

    import torch
    from tpu_worker import PROTOCOL_VERSION, __version__
    from tpu_worker.errors import invalid
    from tpu_worker.server import Server

    device = {
        "kind": "cpu", "name": "bench echo", "index": 0, "count": 1, "memory_total_bytes": None,
        "memory_free_bytes": None, "backend": "cpu", "backend_version": torch.__version__,
    }

    class EchoWorker:
        device = torch.device("cpu")

        def hello(self) -> dict:
            return {
                "type": "hello", "protocol": PROTOCOL_VERSION, "worker_version": __version__,
                "torch_version": torch.__version__, "python_version": sys.version.split()[0],
                "pid": os.getpid(), "device": device, "devices": [device], "probe": [],
                "backend_version": torch.__version__,
            }

        def handle(self, op, args, tensors, ctx):
            if op != "echo":
                raise invalid(f"unknown op {op!r}; this bench worker only knows 'echo'")
            return {"echoed": len(tensors)}, tensors

        def close(self) -> None:
            pass

    return Server(EchoWorker(), sys.stdin.buffer, proto, max_body_bytes=1024**3).serve()


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
