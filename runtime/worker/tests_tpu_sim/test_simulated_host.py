"""The worker on a simulated TPU host, started through its real entry point
(`python -m tpu_worker`) with the real torch-tpu 0.2.0 wheel. See conftest.py and
tpu_sim/hook/sitecustomize.py for exactly what is faked (the PCI/VFIO scan and the accelerator
memory/synchronize calls); tensor allocation and execution are not, so nothing here runs a
kernel on `tpu`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import WORKER_DIR, make_env, overlay_python
from wire import WorkerProcess

GiB = 1024**3
TORCHTPU_LOADED = "Successfully renamed PrivateUse1 backend to 'tpu'"


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def start(tpu_python, catalog, *args, env):
    return WorkerProcess(catalog, *args, env=env, python=tpu_python, start_timeout=300)


def test_auto_says_hello_on_the_tpu(tpu_python, catalog_path, sim_host, tmp_path):
    log = str(tmp_path / "calls.log")
    w = start(tpu_python, catalog_path, "--device", "auto", env=make_env(sim_host, log))
    try:
        h = w.hello
        d = h["device"]
        assert h["type"] == "hello", h
        assert (d["kind"], d["name"], d["index"], d["count"]) == ("tpu", "TPU v6e", 0, 4)
        assert d["backend_version"] == "0.2.0 (libtpu 0.0.52)"
        assert d["memory_total_bytes"] == 32 * GiB and d["devices_per_chip"] == 1
        assert h["probe"][0]["matched"] and "4 device(s)" in h["probe"][0]["reason"]
        assert h["eager_mode"] == {
            "requested": "strict",
            "expected": "DEFER_NEVER",
            "in_force": "DEFER_NEVER",
            "matches": True,
        }
        assert h["execution_mode"] == "eager (DEFER_NEVER)"
        assert h["matmul_precision"].startswith("medium (TorchTPU DEFAULT: 1 bf16 pass")
        # The probe claimed only its own chip, as tpu:0.
        assert _read(log).split()[1:] == ["_accelerator_getMemoryInfo", "0"]
    finally:
        assert w.close() == 0


def test_tpu_n_binds_the_process_to_chip_n_and_refuses_the_others(tpu_python, catalog_path, sim_host, tmp_path):
    log = str(tmp_path / "calls.log")
    w = start(tpu_python, catalog_path, "--device", "tpu:2", env=make_env(sim_host, log))
    try:
        d = w.hello["device"]
        assert (d["kind"], d["index"], d["local_index"]) == ("tpu", 2, 0)
        assert [x["served_here"] for x in w.hello["devices"]] == [False, False, True, False]
        assert _read(log).split()[1:] == ["_accelerator_getMemoryInfo", "0"]  # tpu:0 inside
        status, _ = w.call("status", id="s1")
        assert status["type"] == "result" and status["result"]["device"]["index"] == 2
        err, _ = w.call("load", {"model": "mnist-cnn", "device": "tpu:1"}, id="l1")
        assert err["type"] == "error" and err["error"]["code"] == "unsupported_device"
        msg = err["error"]["message"]
        assert "serves tpu:2 (TPU v6e) only" in msg and "one chip per process" in msg and "'tpu:1'" in msg
    finally:
        assert w.close() == 0


def test_tpu0_works(tpu_python, catalog_path, sim_host):
    w = start(tpu_python, catalog_path, "--device", "tpu:0", env=make_env(sim_host))
    try:
        assert (w.hello["device"]["kind"], w.hello["device"]["index"]) == ("tpu", 0)
        r, _ = w.call("selftest", id="t1")
        assert r["type"] == "result", r
        steps = {s["step"]: s for s in r["result"]["steps"]}
        assert r["result"]["device"] == "tpu:0" and r["result"]["compile_backend"] == "tpu"
        assert steps["memory"]["ok"] and steps["memory"]["detail"]["total_bytes"] == 32 * GiB
        assert steps["synchronize"]["ok"]
    finally:
        assert w.close() == 0


def test_torchtpus_persistent_compile_cache_is_kept_under_the_servers_data_dir(
    tpu_python, catalog_path, sim_host, tmp_path
):
    """Started as the server starts it (--compile-cache data_dir/compile-cache, no override in the
    environment), the worker on the TPU host points TorchTPU's persistent (tier-3) compile cache
    under that folder before `import torch` and says so in hello; the cache counts a compiled
    load's `compile_cache.state` is read from (TorchTPU 0.2.0's private PerfStats) are there."""
    data = str(tmp_path / "data" / "compile-cache")
    env = make_env(sim_host)
    env.pop("TPU_WORKER_COMPILATION_CACHE")
    w = start(tpu_python, catalog_path, "--device", "tpu:0", "--compile-cache", data, env=env)
    try:
        assert w.hello["compile_cache"] == {"dir": data, "backend_dir": os.path.join(data, "torch_tpu")}
        assert os.path.isdir(os.path.join(data, "torch_tpu"))
    finally:
        assert w.close() == 0
    script = (
        "import json, torch\n"
        "from tpu_worker.compiles import compile_cache_report\n"
        "from tpu_worker.platforms import platform_for\n"
        "p = platform_for('tpu')\n"
        "s = p.compile_cache_stats()\n"
        "print(json.dumps({'stats': s, 'report': compile_cache_report(None, 0, p, s), 'dir': p.compile_cache_dir()}))\n"
    )
    env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = os.path.join(data, "torch_tpu")
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=WORKER_DIR
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["stats"] == {"requests": 0, "hits": 0, "compilations": 0}  # nothing ran on the chip
    assert out["dir"] == os.path.join(data, "torch_tpu")
    assert out["report"]["state"] == "cold" and out["report"]["backend"]["warm"] is False


def test_memory_and_synchronize_come_from_the_device_not_from_constants(tpu_python, catalog_path, sim_host, tmp_path):
    # The simulated chip has 5 GiB in use and 0.4 s of work queued at every synchronize: a worker
    # that reports total as free, or reads its clock without synchronizing, fails here.
    log = str(tmp_path / "calls.log")
    env = make_env(sim_host, log, TPU_SIM_HBM_USED_BYTES=str(5 * GiB), TPU_SIM_SYNC_WORK_S="0.4")
    w = start(tpu_python, catalog_path, "--device", "tpu:1", env=env)
    try:
        status, _ = w.call("status", id="s1")
        d = status["result"]["device"]
        assert (d["memory_total_bytes"], d["memory_free_bytes"]) == (32 * GiB, 27 * GiB)
        r, _ = w.call("selftest", id="t1")
        steps = {s["step"]: s for s in r["result"]["steps"]}
        assert steps["memory"]["detail"] == {"total_bytes": 32 * GiB, "free_bytes": 27 * GiB}
        assert steps["synchronize"]["ok"] and steps["synchronize"]["seconds"] >= 0.4
        calls = [line.split()[1:] for line in _read(log).splitlines()]
        assert any(c[:1] == ["_accelerator_synchronizeDevice"] for c in calls), calls
    finally:
        assert w.close() == 0


def test_an_index_beyond_the_host_is_refused_before_hello(tpu_python, catalog_path, sim_host):
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-m", "tpu_worker", "--catalog", catalog_path, "--device", "tpu:7"],
        env=make_env(sim_host),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 4
    assert b"device index 7 requested but only 4 device(s) visible" in p.stdout


@pytest.mark.parametrize(
    ("mode", "in_force"),
    [("strict", "DEFER_NEVER"), ("fused", "DEFER_AND_FUSE"), ("blocking", "DEFER_NEVER_AND_LAUNCH_BLOCKING")],
)
def test_the_eager_mode_requested_is_the_one_in_force(tpu_python, catalog_path, sim_host, mode, in_force):
    w = start(tpu_python, catalog_path, "--device", "tpu", "--tpu-eager", mode, env=make_env(sim_host))
    try:
        assert w.hello["eager_mode"] == {"requested": mode, "expected": in_force, "in_force": in_force, "matches": True}
        s, _ = w.call("status", id="s")
        assert s["result"]["eager_mode"]["in_force"] == in_force
    finally:
        assert w.close() == 0


def test_a_mismatched_eager_mode_is_visible(tpu_python, catalog_path, sim_host):
    # What the old TPU_LAUNCH_BLOCKING looked like, made visible: the environment forces another
    # mode than --tpu-eager asks for, and the read-back says so.
    env = make_env(sim_host, TORCH_TPU_DEFER_AND_FUSE="1")
    w = start(tpu_python, catalog_path, "--device", "tpu", "--tpu-eager", "strict", env=env)
    try:
        assert w.hello["eager_mode"]["in_force"] == "DEFER_AND_FUSE"
        assert w.hello["eager_mode"]["matches"] is False
    finally:
        w.close()


def test_the_precision_set_is_the_precision_reported(tpu_python, catalog_path, sim_host):
    w = start(tpu_python, catalog_path, "--device", "tpu", env=make_env(sim_host))
    try:
        r, _ = w.call("selftest", id="p")
        precisions = [s for s in r["result"]["steps"] if s["step"].startswith("matmul_precision")]
        assert [(s["detail"]["set"], s["ok"]) for s in precisions] == [
            ("medium", True),
            ("high", True),
            ("highest", True),
        ]
        assert precisions[2]["detail"]["reported"] == "highest (TorchTPU HIGHEST: 6 bf16 passes)"
        bad, _ = w.call("load", {"model": "mnist-cnn", "matmul_precision": "max"}, id="b")
        assert bad["error"]["code"] == "invalid_argument" and "'medium', 'high' or 'highest'" in bad["error"]["message"]
        s, _ = w.call("status", id="s")
        assert s["result"]["matmul_precision"].startswith("medium")  # restored after the self-test
    finally:
        assert w.close() == 0


def test_compile_uses_the_tpu_backend_with_dynamic_false(tpu_python, sim_host, tmp_path):
    """In a process on the simulated host: the worker's compile call reaches torch.compile (as
    TorchTPU patched it) with backend "tpu" and dynamic=False, for every adapter kind."""
    script = r"""
import json, torch, torch_tpu._loader as L
from tpu_worker import adapters
from tpu_worker.platforms import platform_for
seen = []
real = L._torch_compile
L._torch_compile = lambda *a, **k: seen.append({"backend": k.get("backend"), "dynamic": k.get("dynamic")}) or a[0]
dev = torch.device("tpu:0")
backend = platform_for(dev).compile_backend(dev)
out = {"registered": "tpu" in torch._dynamo.list_backends(), "backend": backend, "calls": []}
for cls in (adapters.SentenceEmbedder, adapters.CausalLM, adapters.TensorModel):
    a = object.__new__(cls)
    a.device, a.eager_model, a.plan = dev, torch.nn.Linear(2, 2), None
    a.compile()
    out["calls"].append({"adapter": cls.__name__, "dynamic": a.compile_dynamic})
out["seen"] = seen
print(json.dumps(out))
"""
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", script], env=make_env(sim_host), capture_output=True, text=True, timeout=180, cwd=WORKER_DIR
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["registered"] and out["backend"] == "tpu"
    assert out["seen"] == [{"backend": "tpu", "dynamic": False}] * 3
    assert all(c["dynamic"] is False for c in out["calls"])


def test_cpu_with_the_wheel_installed_keeps_torchtpu_out(tpu_python, catalog_path, sim_host):
    w = start(tpu_python, catalog_path, "--device", "cpu", env=make_env(sim_host))
    try:
        assert w.hello["device"]["kind"] == "cpu"
        assert w.hello["eager_mode"] is None
        r, _ = w.call("load", {"model": "mnist-cnn"}, id="l")
        assert r["type"] == "result", r
    finally:
        assert w.close() == 0
    assert not any(TORCHTPU_LOADED in line for line in w.stderr_lines)


def test_without_a_chip_the_real_wheel_falls_through_to_cpu(tpu_python, catalog_path):
    w = start(tpu_python, catalog_path, "--device", "auto", env=make_env(None))
    try:
        step = w.hello["probe"][0]
        assert w.hello["device"]["kind"] == "cpu"
        assert step["backend"] == "torch_tpu" and not step["matched"]
        assert "no TPU chip exposed through VFIO" in step["reason"]
    finally:
        assert w.close() == 0


def _inventory(python, env):
    return subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [python, "-m", "tpu_worker", "inventory"], env=env, capture_output=True, text=True, timeout=120
    )


def test_inventory_counts_chips_without_claiming_one(tpu_python, sim_host, tmp_path):
    log = str(tmp_path / "calls.log")
    p = _inventory(tpu_python, make_env(sim_host, log))
    assert p.returncode == 0, p.stderr[-1500:]
    assert len(p.stdout.splitlines()) == 1
    assert json.loads(p.stdout) == {"kind": "tpu", "count": 4, "name": "TPU v6e", "devices_per_chip": 1, "problems": []}
    assert not os.path.exists(log)  # no memory query, no synchronize: no chip claimed


def test_inventory_on_a_v7_host(tpu_python, tmp_path):
    from tpu_sim import host

    root = host.make_host(str(tmp_path / "v7"), 2, "v7")
    p = _inventory(tpu_python, make_env(root))
    assert json.loads(p.stdout)["name"] == "TPU v7" and json.loads(p.stdout)["devices_per_chip"] == 2


@pytest.mark.parametrize(
    ("hide", "torch_version", "words"),
    [
        (("libtpu",), None, "libtpu is missing"),
        (("zmq", "pyzmq"), None, "pyzmq is missing"),
        ((), "2.9.0", "torch 2.9.0 is outside torch-tpu 0.2.0's supported range"),
    ],
)
def test_a_broken_install_is_diagnosed_in_words(
    tpu_python, catalog_path, sim_host, tmp_path, hide, torch_version, words
):
    py = overlay_python(tpu_python, str(tmp_path / "env"), hide, torch_version)
    env = make_env(sim_host)
    inv = _inventory(py, env)
    assert inv.returncode == 2 and inv.stdout == ""
    assert inv.stderr.strip().splitlines()[-1].startswith("broken TorchTPU install: ") and words in inv.stderr
    # auto: served on the CPU, the probe says why TorchTPU was not used.
    w = start(py, catalog_path, "--device", "auto", env=env)
    try:
        assert w.hello["device"]["kind"] == "cpu"
        assert words in w.hello["probe"][0]["reason"]
    finally:
        assert w.close() == 0
    # cpu: starts (TorchTPU kept out of `import torch`).
    w = start(py, catalog_path, "--device", "cpu", env=env)
    assert w.hello["device"]["kind"] == "cpu" and w.close() == 0
    # tpu: refused before hello with the reason, not a crash.
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [py, "-m", "tpu_worker", "--catalog", catalog_path, "--device", "tpu"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 4 and words.encode() in p.stdout


def _loaded_library(fragment: str) -> str:
    with open("/proc/self/maps", encoding="utf-8") as fh:
        for line in fh:
            path = line.split()[-1]
            if fragment in path and path.startswith("/"):
                return path
    raise LookupError(fragment)


def test_the_worker_reexecs_itself_with_the_allocator_preloaded(tpu_python, catalog_path, sim_host):
    # tcmalloc is not installed on CI machines: any library shows the mechanism (same pid, the
    # library in LD_PRELOAD of the process that then says hello).
    lib = _loaded_library("libm.so")
    w = start(tpu_python, catalog_path, "--device", "tpu", env=make_env(sim_host, TPU_WORKER_TCMALLOC=lib))
    try:
        assert w.hello["pid"] == w.proc.pid and w.hello["device"]["kind"] == "tpu"
        with open(f"/proc/{w.proc.pid}/environ", "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
        assert env[b"LD_PRELOAD"] == lib.encode() and env[b"TPU_WORKER_TCMALLOC_PRELOADED"] == lib.encode()
    finally:
        assert w.close() == 0


def test_train_step_compiles_for_the_tpu_and_times_each_step_to_its_synchronize(tpu_python, sim_host, tmp_path):
    """The benchmark's work "train_step" on the simulated host: its compile call reaches
    torch.compile (as TorchTPU patched it) with backend "tpu" and dynamic=False, and every
    measured step ends at the platform's synchronize, which finds 0.05 s of device work queued:
    a step timed without it would take about a millisecond. The model runs on the host (no kernel
    runs on `tpu` here); the device object, platform and clock reads are the TPU path's."""
    log = str(tmp_path / "calls.log")
    script = r"""
import json, torch, torch_tpu._loader as L
from tpu_worker import adapters
from tpu_worker.bench import train_bench, train_step
from tpu_worker.bench.host import ProcHost
from tpu_worker.bench.stability import Goal
from tpu_worker.cancel import CancelToken
seen = []
L._torch_compile = lambda *a, **k: seen.append({"backend": k.get("backend"), "dynamic": k.get("dynamic")}) or a[0]
source = object.__new__(adapters.TensorModel)
source.device, source.eager_model = torch.device("tpu:0"), adapters.MnistCNN()
trainer = train_step.Trainer(source, "float32", "compile", "sgd")
g = torch.Generator().manual_seed(0)
batch = {"x": torch.randn((2, 1, 28, 28), generator=g), "labels": torch.tensor([1, 7])}
res = train_bench.measure_train(
    trainer, batch, warmup=1, goal=Goal(3, None, 1, 10, 60.0), host=ProcHost(), token=CancelToken()
)
print(json.dumps({
    "seen": seen, "backend": trainer.compile_backend, "platform": type(trainer.platform).__name__,
    "iterations": res["iterations"], "p50_ms": res["latency_ms"]["p50"], "steps": res["train_steps"],
    "peak_kind": res["peak_memory_kind"], "loss": [res["loss_first"], res["loss_final"]],
}))
"""
    env = make_env(sim_host, log, TPU_SIM_SYNC_WORK_S="0.05")
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=WORKER_DIR
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["seen"] == [{"backend": "tpu", "dynamic": False}] and out["backend"] == "tpu"
    assert out["platform"] == "TpuPlatform"
    assert out["iterations"] == 3 and out["steps"] == 4 and out["loss"][0] != out["loss"][1]
    assert out["p50_ms"] >= 50  # the queued device work, waited for before the clock was read
    calls = [line.split()[1:] for line in _read(log).splitlines()]
    syncs = [c for c in calls if c[:1] == ["_accelerator_synchronizeDevice"]]
    assert len(syncs) >= 2 * out["steps"], calls  # before and after every step
    assert out["peak_kind"] != "cpu_peak_rss"  # the device's memory, not the host's


def test_the_static_decode_loop_compiles_for_the_tpu_and_warms_each_shape_to_its_synchronize(
    tpu_python, catalog_path, sim_host, tmp_path
):
    """The static-cache decode loop of tiny-gpt2 with its adapter on `tpu:0`: its compile call
    reaches torch.compile (as TorchTPU patched it) with dynamic=False and the counting backend of
    TorchTPU's "tpu", and the load's warm-up of every shape of the plan ends each forward at the
    platform's synchronize (0.02 s of device work queued each). No kernel can run on `tpu` here,
    so tensors the worker puts on `tpu` stay on the host (a TorchFunctionMode in this script, in
    the loop's thread too); the loop then decodes requests that join mid-decode and gives the
    tokens the same loop gives on the CPU."""
    log = str(tmp_path / "calls.log")
    script = r"""
import json, sys, time, torch, torch_tpu._loader as L
from torch.overrides import TorchFunctionMode
from tpu_worker.cancel import CancelToken
from tpu_worker.catalog import load_catalog
from tpu_worker.compiles import CompileCounter
from tpu_worker.generation.loop import DecodeLoop
from tpu_worker.ops import OpContext, Worker
from tpu_worker.platforms import platform_for
from tpu_worker.probe import probe

TPU = torch.device("tpu:0")
seen = []
def fake_compile(*a, **k):
    # The decorator form (llguidance's bitmask helper, imported by the load's token-choice
    # warm-up) compiles nothing here and is not the model's compile.
    if not a:
        return lambda f: f
    seen.append({"backend": getattr(k.get("backend"), "platform_backend", None), "dynamic": k.get("dynamic")})
    return a[0]
L._torch_compile = fake_compile

def on_tpu(d):
    return isinstance(d, (str, torch.device)) and torch.device(d).type == "tpu"

class OnHost(TorchFunctionMode):
    # What the worker asks to put on `tpu` stays on the host (no chip to run it on).
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if on_tpu(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and on_tpu(args[1]):
            args = (args[0], *args[2:])
        return func(*args, **kwargs)

run = DecodeLoop._run
def run_on_host(self):
    with OnHost():
        run(self)
DecodeLoop._run = run_on_host

REQS = [
    {"texts": ["the first request decodes for a long while"], "max_new_tokens": 24},
    {"texts": ["a"], "max_new_tokens": 3},
    {"texts": ["a longer prompt than the first one, by quite a few tokens " * 2], "max_new_tokens": 9},
]

def decode(loop, adapter):
    futures = []
    def join(p, total=None, message=None, delta=None):
        if p == 3:  # the first request is decoding: the others join at the next boundary
            futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in REQS[1:])
    head = loop.submit(adapter.prepare({**REQS[0], "stream": True}, []), CancelToken(), progress=join)
    out = [head.result(timeout=300).result] + [f.result(timeout=300).result for f in futures]
    return [r["texts"] for r in out], loop.stats.joins

w = Worker(load_catalog(sys.argv[1]), probe("cpu"))
w.handle("load", {"model": "tiny-gpt2"}, [], OpContext("l"))
adapter = w.served["tiny-gpt2"].adapter
cpu_loop = DecodeLoop("cpu", adapter, max_batch=16)
on_cpu = decode(cpu_loop, adapter)
cpu_loop.close("done")

adapter.device = TPU
adapter.compile(CompileCounter("tiny-gpt2"))
with OnHost():
    loop = DecodeLoop("tpu", adapter, max_batch=16)
    t0 = time.perf_counter()
    warmed = loop.warm(lambda *a, **k: None, CancelToken())
    warm_s = time.perf_counter() - t0
on_tpu_path = decode(loop, adapter)
print(json.dumps({
    "seen": seen, "dynamic": adapter.compile_dynamic, "platform": type(platform_for(adapter.device)).__name__,
    "cache": loop.describe()["cache"], "warmed": warmed, "plan": adapter.plan.size, "warm_s": warm_s,
    "same_tokens": on_tpu_path == on_cpu, "joins": on_tpu_path[1],
}))
loop.close("done")
w.close()
"""
    env = make_env(sim_host, log, TPU_SIM_SYNC_WORK_S="0.02")
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", script, catalog_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=WORKER_DIR,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["seen"] == [{"backend": "tpu", "dynamic": False}] and out["dynamic"] is False
    assert out["platform"] == "TpuPlatform" and out["cache"] == "static"
    assert out["warmed"] == out["plan"] > 0
    calls = [line.split()[1:] for line in _read(log).splitlines()]
    syncs = [c for c in calls if c[:1] == ["_accelerator_synchronizeDevice"]]
    assert len(syncs) >= out["plan"], calls  # one after every warmed shape
    assert out["warm_s"] >= 0.02 * out["plan"]  # the queued device work, waited for each time
    assert out["same_tokens"] and out["joins"] == 2, out  # the two requests joined mid-decode
