"""The TorchTPU call shapes, against a fake `torch.tpu` that behaves like torch-tpu 0.2.0 on
torch >= 2.11: is_available, device_count, synchronize (and the other gated device calls) RAISE
RuntimeError when user code calls them; torch.accelerator.* is the public path. The real wheel
is exercised by the simulated-TPU suite (tests_tpu_sim/)."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from tpu_worker import flops, launch, probe
from tpu_worker.platforms import platform_for, set_matmul_precision

TPU = platform_for("tpu")

GiB = 1024**3


def _gated(name):
    def fn(*a, **k):
        raise RuntimeError(
            f"{name} is internal to TorchTPU and can only be called by the PyTorch framework (torch and "
            f"torch_tpu). Use torch.accelerator.{name} instead."
        )

    return fn


class _Mode:
    def __init__(self, name):
        self.name = name


@pytest.fixture
def fake_tpu(monkeypatch):
    """A host with 4 TPU v6e chips as TorchTPU 0.2.0 presents it, before its runtime starts."""
    tpu = types.SimpleNamespace(
        is_available=_gated("is_available"),
        device_count=_gated("device_count"),
        synchronize=_gated("synchronize"),
        current_device=_gated("current_device_index"),
        get_device_name=lambda device=None: "TPU v6e",
        eager_mode=_Mode("DEFER_NEVER"),
        _get_cache_misses=lambda: 7,
        is_initialized=lambda: False,
    )
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    calls: list = []
    acc = types.SimpleNamespace(type="tpu")
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: acc)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 4)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)

    def meminfo(i):
        calls.append(("get_memory_info", i))
        return (20 * GiB, 31 * GiB)

    monkeypatch.setattr(torch.accelerator, "get_memory_info", meminfo)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: calls.append(("synchronize",)))
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    monkeypatch.setattr(launch, "torch_tpu_install_problems", lambda: [])
    monkeypatch.setitem(sys.modules, "torch_tpu", types.ModuleType("torch_tpu"))
    versions = {"torch-tpu": "0.2.0", "libtpu": "0.0.52"}
    monkeypatch.setattr(launch, "dist_version", versions.get)
    tpu.calls = calls
    return tpu


def test_probe_counts_through_torch_accelerator_not_the_gated_calls(fake_tpu):
    f = probe.gather_tpu()
    assert f.importable and f.available, f.unavailable_reason
    assert f.count == 4 and f.names == ["TPU v6e"] * 4
    assert f.version == "0.2.0 (libtpu 0.0.52)"  # torch_tpu.__version__ is None in 0.2.0
    # Only the device this process serves is queried (the query claims the chip).
    assert fake_tpu.calls == [("get_memory_info", 0)]
    assert f.memory[0] == (31 * GiB, 20 * GiB) and f.memory[1] == (None, None)


def test_auto_selects_the_tpu_with_the_real_call_shapes(fake_tpu):
    r = probe.probe("auto")
    assert r.device["kind"] == "tpu" and r.device["backend_version"].startswith("0.2.0")
    assert r.steps[0]["matched"] and "4 device(s)" in r.steps[0]["reason"]


def test_bound_worker_serves_host_chip_n_as_tpu0(fake_tpu, monkeypatch):
    b = launch.bind_device("tpu", 2, {})
    assert b.env["TPU_VISIBLE_DEVICES"] == "2" and b.local == 0
    r = probe.probe("tpu:2", binding=b)
    assert r.device["index"] == 2 and r.device["local_index"] == 0
    assert probe.torch_device_string(r.device) == "tpu:0" and probe.device_label(r.device) == "tpu:2"
    assert [d["served_here"] for d in r.devices] == [False, False, True, False]
    assert fake_tpu.calls == [("get_memory_info", 0)]  # tpu:0 inside the process
    assert r.devices[2]["memory_free_bytes"] == 20 * GiB


def test_no_chip_falls_through_with_a_reason(fake_tpu, monkeypatch):
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: None)
    f = probe.gather_tpu()
    assert not f.available and "no TPU chip exposed through VFIO" in f.unavailable_reason


def test_broken_install_is_reported_in_words_without_importing(monkeypatch):
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    monkeypatch.setattr(launch, "torch_tpu_install_problems", lambda: ["libtpu is missing"])
    f = probe.gather_tpu()
    assert not f.importable and f.import_error == "libtpu is missing"


def test_synchronize_uses_torch_accelerator(fake_tpu):
    TPU.synchronize(types.SimpleNamespace(type="tpu", index=0))
    assert fake_tpu.calls == [("synchronize",)]


def test_precision_is_read_back_through_the_patched_getter(fake_tpu, monkeypatch):
    state = {"p": "medium"}  # TorchTPU patches the getter/setter onto its global precision
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda v: state.update(p=v))
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: state["p"])
    dev = types.SimpleNamespace(type="tpu", index=0)
    assert TPU.matmul_precision(dev).startswith("medium (TorchTPU DEFAULT: 1 bf16 pass")
    set_matmul_precision("highest")
    assert TPU.matmul_precision(dev).startswith("highest (TorchTPU HIGHEST: 6")
    assert flops.peak_flops("tpu", "TPU v6e", "float32", TPU.matmul_precision(dev))[0] == pytest.approx(918e12 / 6)
    set_matmul_precision("high")
    assert flops.peak_flops("tpu", "TPU v6e", "float32", TPU.matmul_precision(dev))[0] == pytest.approx(918e12 / 3)


@pytest.mark.parametrize(
    ("requested", "in_force", "matches"),
    [
        ("strict", "DEFER_NEVER", True),
        ("blocking", "DEFER_NEVER_AND_LAUNCH_BLOCKING", True),
        ("blocking", "DEFER_NEVER", False),
    ],
)
def test_eager_mode_is_read_back(fake_tpu, monkeypatch, requested, in_force, matches):
    monkeypatch.setenv(launch.EAGER_ENV, requested)
    fake_tpu.eager_mode = _Mode(in_force)
    rep = TPU.eager_mode_report(types.SimpleNamespace(type="tpu"))
    assert rep == {
        "requested": requested,
        "expected": launch.EAGER_MODES[requested][1],
        "in_force": in_force,
        "matches": matches,
    }
    assert TPU.execution_mode(types.SimpleNamespace(type="tpu")) == f"eager ({in_force})"


def test_tpu_compile_cache_misses_are_read_when_present(fake_tpu):
    assert TPU.compile_cache_misses() == 7
    del fake_tpu._get_cache_misses
    assert TPU.compile_cache_misses() is None


def test_import_env_shortens_the_openmp_spin_unless_the_operator_set_it():
    assert launch.import_env("cpu", "strict", {})["GOMP_SPINCOUNT"] == launch.OPENMP_SPIN
    assert "GOMP_SPINCOUNT" not in launch.import_env("cpu", "strict", {"GOMP_SPINCOUNT": "300000"})


def test_import_env(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    monkeypatch.setattr(launch, "torch_tpu_install_problems", lambda: [])
    base = {"TPU_WORKER_COMPILATION_CACHE": str(tmp_path)}
    for kind in ("cpu", "cuda", "xla"):
        assert launch.import_env(kind, "strict", base)["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    env = launch.import_env("tpu", "blocking", base)
    assert env["TORCH_TPU_LAUNCH_BLOCKING"] == "1" and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in env
    assert env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == str(tmp_path)
    assert launch.import_env("auto", "fused", base)["TORCH_TPU_DEFER_AND_FUSE"] == "1"
    # A broken install is kept out of `import torch` even for auto (the probe says why).
    monkeypatch.setattr(launch, "torch_tpu_install_problems", lambda: ["libtpu is missing"])
    assert launch.import_env("auto", "strict", base)["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_torchtpu_keeps_its_compile_cache_under_the_workers_compile_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    monkeypatch.setattr(launch, "torch_tpu_install_problems", lambda: [])
    data = str(tmp_path / "data" / "compile-cache")  # --compile-cache: the server's data_dir/compile-cache
    env = launch.import_env("tpu", "strict", {}, data)
    assert env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == os.path.join(data, "torch_tpu")
    assert os.path.isdir(os.path.join(data, "torch_tpu"))
    # The operator's own choice wins: TPU_WORKER_COMPILATION_CACHE, or TorchTPU's variable itself.
    own = {"TPU_WORKER_COMPILATION_CACHE": str(tmp_path / "own")}
    assert (
        launch.import_env("tpu", "strict", own, data)["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"]
        == own["TPU_WORKER_COMPILATION_CACHE"]
    )
    set_ = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "/elsewhere"}
    assert "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT" not in launch.import_env("tpu", "strict", set_, data)


def test_a_load_is_warm_when_the_backends_cache_compiled_nothing():
    from tpu_worker.compiles import compile_cache_report

    class Plat:
        def __init__(self, stats):
            self.stats = stats

        def compile_cache_stats(self):
            return self.stats

        def compile_cache_dir(self):
            return "/d/torch_tpu"

    before = {"requests": 10, "hits": 0, "compilations": 10}
    cold = compile_cache_report("/d", 0, Plat({"requests": 40, "hits": 2, "compilations": 38}), before)
    assert cold["state"] == "cold" and cold["warm"] is False
    assert cold["backend"] == {"dir": "/d/torch_tpu", "requests": 30, "hits": 2, "compilations": 28, "warm": False}
    warm = compile_cache_report("/d", 0, Plat({"requests": 40, "hits": 30, "compilations": 10}), before)
    assert warm["state"] == "warm" and warm["backend"]["warm"] is True
    # No backend cache (the CPU): inductor's FX graph cache hits alone decide.
    assert compile_cache_report("/d", 3, Plat(None), None) == {"dir": "/d", "hits": 3, "warm": True, "state": "warm"}
    assert compile_cache_report(None, 0, Plat(None), None)["state"] == "cold"


def test_install_problems_in_words(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: object() if n == "torch_tpu" else None if n in ("libtpu", "zmq") else real(n, *a),
    )
    monkeypatch.setattr(launch, "dist_version", {"torch": "2.9.1", "torch-tpu": "0.2.0"}.get)
    problems = launch.torch_tpu_install_problems()
    assert len(problems) == 3
    assert "libtpu is missing" in problems[0] and "pyzmq is missing" in problems[1]
    assert "torch 2.9.1 is outside torch-tpu 0.2.0's supported range" in problems[2]


def test_binding_respects_the_parent():
    b = launch.bind_device("tpu", 3, {"TPU_VISIBLE_DEVICES": "3"})
    assert b.local == 0 and "TPU_VISIBLE_DEVICES" not in b.env
    b = launch.bind_device("cuda", 1, {})
    assert b.env == {"CUDA_VISIBLE_DEVICES": "1", "TPU_WORKER_HOST_INDEX": "1"} and b.local == 0
    assert launch.bind_device("tpu", None, {}).env == {}
    b = launch.bind_device("tpu", None, {"TPU_VISIBLE_DEVICES": "5"})
    assert (b.index, b.local, b.env) == (5, 0, {})
    env = launch.bind_device("tpu", 1, {}).env
    assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1" and env["TPU_PROCESS_PORT"] == "8477"


def test_v7_is_two_devices_per_chip():
    assert probe.tpu_hbm_from_name("TPU v7") == 96 * GiB
    peak, source = flops.peak_flops("tpu", "TPU v7", "bfloat16", "medium")
    assert peak == pytest.approx(2307e12 / 2) and "2 devices per chip" in source
    assert flops.peak_flops("tpu", "TPU v6e", "float16", "medium")[1].endswith("assumed bf16 path)")


def test_tcmalloc_is_preloaded_only_where_torchtpu_will_load(monkeypatch, tmp_path):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.setattr(launch, "TCMALLOC_PATHS", (str(tmp_path / "absent.so"), str(lib)))
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    assert launch.tcmalloc_preload("tpu", {}) == str(lib)
    assert launch.tcmalloc_preload("auto", {}) == str(lib)
    assert launch.tcmalloc_preload("cpu", {}) is None
    assert launch.tcmalloc_preload("tpu", {"LD_PRELOAD": "/x/libtcmalloc.so.4"}) is None  # already there
    assert launch.tcmalloc_preload("tpu", {"TPU_WORKER_TCMALLOC": "0"}) is None
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: False)
    assert launch.tcmalloc_preload("tpu", {}) is None
    monkeypatch.setattr(launch, "torch_tpu_installed", lambda: True)
    assert launch.tcmalloc_preload("tpu", {launch.PRELOADED_ENV: str(lib)}) is None  # re-exec'd once


def test_fused_mode_outputs_are_materialised_before_the_clock(fake_tpu, monkeypatch):
    tpu = types.SimpleNamespace(type="tpu")
    out = {"a": torch.ones(3), "b": [torch.zeros(2, 2), torch.empty(0)]}
    assert TPU.materialize(out, tpu) == 0  # strict mode: synchronize is enough
    fake_tpu.eager_mode = _Mode("DEFER_AND_FUSE")
    assert TPU.materialize(out, tpu) == 2
    cpu = types.SimpleNamespace(type="cpu")
    assert platform_for(cpu).materialize(out, cpu) == 0
