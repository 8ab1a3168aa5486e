"""The memory pre-flight against what a load really takes, for every built-in model and dtype.

Measured: a fresh worker's resident-set growth from just before its load to its high-water mark
(VmHWM, reset through /proc/<pid>/clear_refs) over the load and a first request (the README's
first chat for SmolLM2). The estimate is the load's own (`estimated_bytes` in its report), which
that worker computed before loading. Ratios, not times: memory does not depend on the host's load.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from wire import WorkerProcess

MiB = 1024**2
BUILTINS = ("smollm2-135m-instruct", "all-minilm-l6-v2", "tiny-gpt2", "tiny-chat", "mnist-cnn")
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_new_tokens": 24}
FIRST_REQUEST = {
    "smollm2-135m-instruct": CHAT,
    "tiny-chat": CHAT,
    "tiny-gpt2": {"texts": ["What is the capital of France?"], "max_new_tokens": 24},
    "all-minilm-l6-v2": {"texts": ["What is the capital of France?"]},
    "mnist-cnn": {},
}


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_peak(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")  # VmHWM := VmRSS
    except OSError as exc:
        pytest.skip(f"this kernel does not let us reset the worker's peak RSS ({exc})")


def measure(catalog_path: str, model: str, dtype: str) -> tuple[int, int]:
    """(the load's estimate, the measured peak growth) in a fresh worker."""
    w = WorkerProcess(catalog_path, "--device", "cpu", "--threads", "1")
    try:
        pid = w.proc.pid
        before = _status_kib(pid, "VmRSS")
        _reset_peak(pid)
        head, _ = w.call("load", {"model": model, "dtype": dtype}, id="load", timeout=600)
        assert head["type"] == "result", head
        tensors = [torch.zeros(1, 1, 28, 28)] if model == "mnist-cnn" else None
        args = {"model": model, **FIRST_REQUEST[model]}
        head2, _ = w.call("infer", args, id="first", tensors=tensors, timeout=600)
        assert head2["type"] == "result", head2
        if model == "smollm2-135m-instruct":
            assert "Paris" in head2["result"]["generations"][0]["text"]
        return head["result"]["estimated_bytes"], _status_kib(pid, "VmHWM") - before
    finally:
        w.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", BUILTINS)
def test_the_estimate_is_within_1_to_1_25_of_the_measured_peak(catalog_path, model, dtype):
    estimate, measured = measure(catalog_path, model, dtype)
    ratio = estimate / measured
    print(f"{model} {dtype}: estimate {estimate / MiB:.0f} MiB, measured {measured / MiB:.0f} MiB, ratio {ratio:.2f}")
    assert 1.0 <= ratio <= 1.25, (model, dtype, estimate, measured)


def test_a_full_prefix_cache_stays_within_the_estimate(catalog_path):
    """The prefix cache fills with use up to its bound; its pool is held from the load on, so a
    worker whose cache is full still peaks under the pre-flight. bfloat16 tiny-gpt2: the most
    blocks (8,192) for the bound, where per-block bookkeeping would show."""
    model = "tiny-gpt2"
    w = WorkerProcess(catalog_path, "--device", "cpu", "--threads", "1")
    try:
        pid = w.proc.pid
        before = _status_kib(pid, "VmRSS")
        _reset_peak(pid)
        head, _ = w.call("load", {"model": model, "dtype": "bfloat16"}, id="load", timeout=600)
        assert head["type"] == "result", head
        estimate = head["result"]["estimated_bytes"]
        cache: dict = {}
        for i in range(400):  # ~100 calls fill it: 16 distinct prompts of ~120 tokens each
            texts = [" ".join(f"w{i * 16 + j}x{k}" for k in range(40)) for j in range(16)]
            h, _ = w.call("infer", {"model": model, "texts": texts, "max_new_tokens": 1}, id=f"f{i}", timeout=600)
            assert h["type"] == "result", h
            s, _ = w.call("status", {}, id=f"s{i}")
            cache = next(m for m in s["result"]["loaded"] if m["model"] == model)["prefix_cache"]
            if cache["bytes"] + 2 * 16 * 2 * 64 * 2 > cache["max_bytes"]:  # no room for another block
                break
        else:
            raise AssertionError(f"the prefix cache did not fill: {cache}")
        measured = _status_kib(pid, "VmHWM") - before
    finally:
        w.close()
    ratio = estimate / measured
    print(f"{model} bfloat16, prefix cache full: estimate {estimate / MiB:.0f} MiB, measured {measured / MiB:.0f} MiB")
    assert 1.0 <= ratio <= 1.25, (estimate, measured)


def test_the_kv_term_is_the_cache_the_loaded_model_allocates(catalog, shared_worker, models_dir):
    """The pre-flight's KV cache is SlotCache's bytes as the load allocated them (GQA-aware)."""
    from tpu_worker.memory import kv_cache_bytes

    for model in ("tiny-gpt2", "tiny-chat"):
        slots = shared_worker.served[model].batcher._batch.slots
        with open(os.path.join(models_dir, model, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
        assert kv_cache_bytes(catalog.get(model), config, "float32") == slots.nbytes()


def test_smollm2_s_kv_cache_is_its_kv_heads_wide(catalog, models_dir):
    """3 key/value heads × 64 (192), not hidden_size (576): 9 slots × 2304 columns × 30 layers."""
    from tpu_worker.memory import kv_cache_bytes

    with open(os.path.join(models_dir, "smollm2-135m-instruct", "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    entry = catalog.get("smollm2-135m-instruct")
    assert kv_cache_bytes(entry, config, "bfloat16") == 2 * 30 * 9 * 3 * 2304 * 64 * 2


def test_the_free_memory_cap_is_what_the_worker_reads(catalog_path):
    w = WorkerProcess(catalog_path, "--device", "cpu", env={"TPU_WORKER_FREE_MEMORY_BYTES": str(2 * 1024**3)})
    try:
        head, _ = w.call("status", {}, id="s")
        assert head["result"]["device"]["memory_free_bytes"] == 2 * 1024**3
        # Too little for SmolLM2 in float32 or bfloat16: refused before loading, saying what fits.
        w2 = WorkerProcess(catalog_path, "--device", "cpu", env={"TPU_WORKER_FREE_MEMORY_BYTES": str(300 * MiB)})
        try:
            head, _ = w2.call("load", {"model": "smollm2-135m-instruct"}, id="l")
            assert head["type"] == "error" and head["error"]["code"] == "insufficient_memory", head
            assert "300.0 MiB free" in head["error"]["message"]
        finally:
            w2.close()
    finally:
        w.close()


def test_a_bad_free_memory_cap_stops_the_worker_with_a_clear_error(catalog_path):
    import subprocess
    import sys

    from wire import WORKER_DIR

    env = {**os.environ, "PYTHONPATH": WORKER_DIR, "TPU_WORKER_FREE_MEMORY_BYTES": "2GiB"}
    r = subprocess.run(
        [sys.executable, "-m", "tpu_worker", "--catalog", catalog_path, "--device", "cpu"],
        stdin=subprocess.DEVNULL,
        check=False,
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2
    assert b"whole number of bytes" in r.stderr


def test_describe_gives_the_server_the_estimate_the_load_checks(catalog_path):
    """One estimate: the server's gate and placement read describe's memory_bytes (server/app)."""
    w = WorkerProcess(catalog_path, "--device", "cpu")
    try:
        head, _ = w.call("describe", {}, id="d")
        described = {m["id"]: m for m in head["result"]["models"]}["tiny-gpt2"]["memory_bytes"]
        assert set(described) == {"float32", "bfloat16", "float16"}
        head, _ = w.call("load", {"model": "tiny-gpt2", "dtype": "bfloat16"}, id="l")
        assert head["result"]["estimated_bytes"] == described["bfloat16"]
    finally:
        w.close()
