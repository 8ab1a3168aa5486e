from __future__ import annotations

import pytest

from tpu_worker.errors import WorkerError
from tpu_worker.platforms.xla import parse_xla_memory_info
from tpu_worker.probe import (
    BackendFacts,
    DeviceRequest,
    GiB,
    UnsupportedDevice,
    decide,
    parse_device,
    torch_device_string,
    tpu_hbm_from_name,
)

ABSENT = {
    "tpu": BackendFacts("tpu", importable=False, import_error="ModuleNotFoundError: No module named 'torch_tpu'"),
    "xla": BackendFacts("xla", importable=False, import_error="ModuleNotFoundError: No module named 'torch_xla'"),
    "cuda": BackendFacts("cuda", unavailable_reason="torch 2.13.0+cpu was built without CUDA"),
    "cpu": BackendFacts(
        "cpu", available=True, count=1, names=["Test CPU"], memory=[(64 * GiB, 32 * GiB)], version="2.13.0"
    ),
}


def gatherer(**overrides):
    facts = {**ABSENT, **overrides}
    calls: list[str] = []

    def gather(kind):
        calls.append(kind)
        return facts[kind]

    gather.calls = calls
    return gather


def test_nothing_but_cpu_falls_through_with_real_reasons():
    r = decide(DeviceRequest("auto"), gatherer())
    assert r.device["kind"] == "cpu" and r.device["name"] == "Test CPU"
    assert [s["matched"] for s in r.steps] == [False, False, False, True]
    assert "No module named 'torch_tpu'" in r.steps[0]["reason"]
    assert "No module named 'torch_xla'" in r.steps[1]["reason"]
    assert "built without CUDA" in r.steps[2]["reason"]
    assert r.device["memory_free_bytes"] == 32 * GiB


def test_torchtpu_present_wins_and_later_backends_are_not_touched():
    tpu = BackendFacts("tpu", available=True, count=4, names=["TPU v6e"] * 4, memory=[(None, None)] * 4, version="0.1")
    g = gatherer(tpu=tpu)
    r = decide(DeviceRequest("auto"), g)
    assert g.calls == ["tpu"]
    assert r.device == {
        "kind": "tpu",
        "name": "TPU v6e",
        "index": 0,
        "count": 4,
        "memory_total_bytes": 32 * GiB,
        "memory_free_bytes": None,
        "backend": "torch_tpu",
        "backend_version": "0.1",
        "devices_per_chip": 1,
        "served_here": True,
    }
    assert len(r.devices) == 4
    assert [d["served_here"] for d in r.devices] == [True, False, False, False]
    assert r.steps[1]["reason"].startswith("skipped")
    assert torch_device_string(r.device) == "tpu:0"


def test_torchtpu_memory_reported_by_runtime_beats_the_table():
    tpu = BackendFacts("tpu", available=True, count=1, names=["TPU v5 lite"], memory=[(17 * GiB, 10 * GiB)])
    r = decide(DeviceRequest("auto"), gatherer(tpu=tpu))
    assert r.device["memory_total_bytes"] == 17 * GiB and r.device["memory_free_bytes"] == 10 * GiB


def test_torchtpu_installed_but_no_chips_falls_back_to_xla():
    tpu = BackendFacts("tpu", available=False, unavailable_reason="torch.tpu.is_available() returned False")
    xla = BackendFacts(
        "xla", available=True, count=8, names=["TPU (torch_xla)"] * 8, memory=[(16 * GiB, 15 * GiB)] * 8, version="2.8"
    )
    r = decide(DeviceRequest("auto"), gatherer(tpu=tpu, xla=xla))
    assert r.device["kind"] == "xla" and r.device["backend"] == "torch_xla"
    assert "is_available() returned False" in r.steps[0]["reason"]
    assert r.steps[1]["matched"]


def test_cuda_present_is_chosen_with_requested_index():
    cuda = BackendFacts(
        "cuda",
        available=True,
        count=2,
        names=["H100", "H100"],
        memory=[(80 * GiB, 70 * GiB), (80 * GiB, 60 * GiB)],
        version="12.8",
    )
    r = decide(DeviceRequest("auto", 1), gatherer(cuda=cuda))
    assert r.device["kind"] == "cuda" and r.device["index"] == 1 and r.device["memory_free_bytes"] == 60 * GiB


def test_cuda_available_but_zero_devices_does_not_match():
    cuda = BackendFacts("cuda", available=True, count=0)
    r = decide(DeviceRequest("auto"), gatherer(cuda=cuda))
    assert r.device["kind"] == "cpu" and "0 devices" in r.steps[2]["reason"]


def test_forcing_cpu_never_gathers_accelerators():
    g = gatherer()
    r = decide(DeviceRequest("cpu"), g)
    assert g.calls == ["cpu"] and r.device["kind"] == "cpu"
    assert all("skipped: --device cpu" in s["reason"] for s in r.steps[:3])


@pytest.mark.parametrize("kind", ["tpu", "xla", "cuda"])
def test_forcing_an_absent_backend_fails_clearly(kind):
    with pytest.raises(UnsupportedDevice) as info:
        decide(DeviceRequest(kind), gatherer())
    assert info.value.code == "unsupported_device" and f"--device {kind}" in info.value.message
    assert info.value.steps[-1]["matched"] is False


def test_forcing_an_index_beyond_the_count_fails():
    tpu = BackendFacts("tpu", available=True, count=1, names=["TPU v4"], memory=[(None, None)])
    with pytest.raises(UnsupportedDevice) as info:
        decide(DeviceRequest("tpu", 3), gatherer(tpu=tpu))
    assert "only 1 device" in info.value.message


def test_import_error_text_is_reported_verbatim():
    tpu = BackendFacts("tpu", importable=False, import_error="ImportError: libtpu.so: cannot open shared object")
    r = decide(DeviceRequest("auto"), gatherer(tpu=tpu))
    assert "libtpu.so" in r.steps[0]["reason"]


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("TPU v4", 32),
        ("TPU v5 lite", 16),
        ("TPU v5e", 16),
        ("TPU v5p", 95),
        ("TPU v6e", 32),
        ("TPU v6 lite", 32),
        ("TPU7x", 96),  # v7: two devices per chip, 192 GiB per chip
        ("TPU v7", 96),
    ],
)
def test_hbm_table(name, gib):
    assert tpu_hbm_from_name(name) == gib * GiB


def test_unknown_tpu_generation_has_unknown_memory():
    assert tpu_hbm_from_name("TPU v99") is None


def test_xla_memory_info_both_shapes():
    assert parse_xla_memory_info({"bytes_limit": 100, "bytes_used": 30}) == (100, 70)
    assert parse_xla_memory_info({"kb_total": 2, "kb_free": 1}) == (2048, 1024)
    assert parse_xla_memory_info(None) == (None, None)


@pytest.mark.parametrize(
    ("text", "kind", "index"),
    [("auto", "auto", None), ("cpu", "cpu", None), ("cuda:1", "cuda", 1), ("tpu", "tpu", None), ("xla:0", "xla", 0)],
)
def test_parse_device(text, kind, index):
    assert parse_device(text) == DeviceRequest(kind, index)


@pytest.mark.parametrize("text", ["gpu", "tpu:x", "cpu:3", "", "cuda:-1"])
def test_parse_device_rejects_garbage(text):
    with pytest.raises(WorkerError):
        parse_device(text)


def test_real_probe_on_this_machine_reports_every_step():
    from tpu_worker.probe import probe

    r = probe("auto")
    assert len(r.steps) == 4 and sum(s["matched"] for s in r.steps) == 1
    assert all(s["reason"] for s in r.steps)
