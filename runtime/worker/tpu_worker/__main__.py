"""Entry point: `python -m tpu_worker --catalog FILE [--device ...]`.

Order matters here: take stdout for the protocol and point fd 1 at stderr (so stray prints,
including from C extensions, cannot corrupt frames), set the environment switches TorchTPU and
Hugging Face read at import time, and only then import torch.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys

from . import launch


def _set_import_env(args: argparse.Namespace) -> launch.Binding:
    """Sets, before `import torch`, what TorchTPU, CUDA and Hugging Face read at import time, and
    binds this process to one chip when --device names an index. Returns the binding."""
    try:
        req = probe_request(args.device)
    except ValueError:
        req = ("auto", None)  # the probe refuses it with a clear message after import
    binding = launch.bind_device(req[0], req[1], dict(os.environ))
    env = {**launch.import_env(req[0], args.tpu_eager, dict(os.environ), args.compile_cache), **binding.env}
    os.environ.update(env)
    return binding


def probe_request(text: str) -> tuple[str, int | None]:
    """(kind, index) from --device without importing torch (probe.parse_device re-checks it)."""
    m = re.fullmatch(r"(auto|cpu|cuda|tpu|xla)(?::(\d+))?", (text or "").strip())
    if not m:
        raise ValueError(text)
    return m.group(1), int(m.group(2)) if m.group(2) is not None and m.group(1) not in ("auto", "cpu") else None


def _maybe_preload_tcmalloc(argv: list[str], device: str) -> None:
    """Re-executes this worker with tcmalloc preloaded when TorchTPU will load and tcmalloc is
    present (TorchTPU warns that host performance degrades without it). Same pid and pipes."""
    try:
        kind = probe_request(device)[0]
    except ValueError:
        return
    lib = launch.tcmalloc_preload(kind, dict(os.environ))
    if lib is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib} {env['LD_PRELOAD']}".strip() if env.get("LD_PRELOAD") else lib
    env[launch.PRELOADED_ENV] = lib
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "tpu_worker", *argv], env)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tpu_worker", description="tpu-mcp compute worker")
    p.add_argument("--catalog", required=True, help="catalog JSON file")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] | tpu[:N] | xla[:N]")
    p.add_argument("--max-body-bytes", type=int, default=1024**3, help="largest frame body accepted")
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=0.0,
        help="accepted for compatibility; the client drives heartbeats with ping",
    )
    p.add_argument("--max-weight-bytes", type=int, default=None, help="refuse weights larger than this")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    p.add_argument(
        "--compile-cache",
        default=None,
        help="folder for compiled graphs kept across restarts (mode compile; the server's data_dir/compile-cache)",
    )
    p.add_argument(
        "--kept-dir",
        default=None,
        help="folder of kept fine-tunes (the server's data_dir/kept): served by id, their digest checked",
    )
    p.add_argument(
        "--tpu-eager", choices=("strict", "fused", "blocking"), default="strict", help="TorchTPU eager execution mode"
    )
    p.add_argument(
        "--engine-vllm",
        default=None,
        help="JSON of runtime.engines.vllm (python, args, url, key_file, ...) for catalog entries with engine vllm",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        # The worker over TCP + mutual TLS (tpu_worker/serve.py); it imports no torch itself.
        from .serve import main as serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["inventory"]:
        from .inventory import main as inventory_main

        return inventory_main(argv[1:])
    args = parse_args(argv)
    _maybe_preload_tcmalloc(argv, args.device)
    proto_out = launch.take_stdout()
    binding = _set_import_env(args)

    from . import logs

    logs.install_logging_bridge()
    logs.info("worker starting", pid=os.getpid(), device=args.device)

    import torch

    from .catalog import CatalogError, load_catalog
    from .errors import WorkerError
    from .loaders import DEFAULT_MAX_WEIGHT_BYTES
    from .ops import Worker
    from .platforms.cpu import free_memory_cap
    from .probe import probe
    from .protocol import encode_frame
    from .server import Server

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.compile_cache:
        from .compiles import CACHE_ENV

        os.environ[CACHE_ENV] = args.compile_cache
    try:
        catalog = load_catalog(args.catalog, args.kept_dir)
    except CatalogError as exc:
        logs.error("catalog rejected", error=str(exc))
        return 2
    try:
        free_memory_cap()
    except ValueError as exc:
        logs.error("TPU_WORKER_FREE_MEMORY_BYTES rejected", error=str(exc))
        return 2
    try:
        result = probe(args.device, binding=binding)
    except WorkerError as exc:
        logs.error("device probe failed", error=exc.message, probe=getattr(exc, "steps", None))
        # Tell the client why before exiting, so it does not just see a dead pipe.
        for chunk in encode_frame({"type": "error", "id": None, "error": exc.to_wire()}):
            proto_out.write(chunk)
        proto_out.flush()
        return 4
    for step in result.steps:
        logs.info("probe", **step)

    from .engines import parse_settings

    try:
        engine_settings = parse_settings(args.engine_vllm)
    except (ValueError, TypeError) as exc:
        logs.error("--engine-vllm rejected", error=str(exc))
        return 2
    worker = Worker(
        catalog,
        result,
        max_weight_bytes=args.max_weight_bytes or DEFAULT_MAX_WEIGHT_BYTES,
        engine_settings=engine_settings,
    )
    server = Server(worker, sys.stdin.buffer, proto_out, max_body_bytes=args.max_body_bytes)

    def on_signal(signum, _frame):
        logs.info("signal received; exiting", signal=signal.Signals(signum).name)
        server.stop(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logs.info("worker ready", device=result.device["kind"], name=result.device["name"], models=len(catalog.entries))
    code = server.serve()
    # TorchTPU writes its persistent compile cache asynchronously and shuts its runtime down in
    # an atexit hook that os._exit would skip: give both a bounded chance to finish.
    worker.platform.shutdown(worker.device, grace_s=10.0)
    return code


def console_main() -> None:
    """`tpu-mcp-worker ...` (console script): the same as `python -m tpu_worker ...`."""
    code = main()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Op threads may be inside long torch calls; do not wait for them at interpreter exit.
    os._exit(code)
