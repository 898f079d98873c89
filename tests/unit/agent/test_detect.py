"""GPU detection: NVML replaced at the `pynvml` module boundary, rocm-smi output, declared inventories."""

from __future__ import annotations

import json
import types

import pytest

from providers.agent.inventory import (
    InventoryError,
    declared_inventory,
    detect,
    detect_nvml,
    detect_rocm,
    load_declared,
    simulated_telemetry,
)


class FakeNVMLError(Exception):
    pass


def fake_nvml(names_mib, *, nvlink_pairs=(), mig=None, fail_init=False):
    """A stand-in for the pynvml module: same functions, canned answers."""
    m = types.SimpleNamespace(NVML_TOPOLOGY_SINGLE=10, NVML_TOPOLOGY_SYSTEM=50, NVML_NVLINK_MAX_LINKS=4, NVML_TEMPERATURE_GPU=0)
    bus = [f"00000000:{i + 0x10:02X}:00.0" for i in range(len(names_mib))]

    def init():
        if fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvlink_state(h, link):
        peers = [b for a, b in nvlink_pairs if a == h] + [a for a, b in nvlink_pairs if b == h]
        if link >= len(peers):
            raise FakeNVMLError("Not Supported")
        return 1

    def nvlink_peer(h, link):
        peers = [b for a, b in nvlink_pairs if a == h] + [a for a, b in nvlink_pairs if b == h]
        return types.SimpleNamespace(busId=bus[peers[link]].encode())

    def mig_mode(h):
        if mig is None:
            raise FakeNVMLError("Not Supported")
        return (mig[h], mig[h])

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    m.nvmlDeviceGetCount = lambda: len(names_mib)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: names_mib[h][0].encode()
    m.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=names_mib[h][1] * 2**20, used=1024 * 2**20)
    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h])
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 10 if abs(a - b) == 1 else 50
    m.nvmlDeviceGetNvLinkState = nvlink_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = nvlink_peer
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=55)
    m.nvmlDeviceGetTemperature = lambda h, kind: 61
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500
    return m


def test_nvml_inventory_reports_models_driver_cuda_topology_and_mig():
    nvml = fake_nvml([("NVIDIA H100 80GB HBM3", 81559)] * 2 + [("NVIDIA A100-SXM4-80GB", 81920)], nvlink_pairs=[(0, 1)], mig=[0, 1, 0])
    inv = detect_nvml(nvml)
    assert inv.source == "nvml" and inv.driver_version == "550.54.15" and inv.cuda_version == "12.4"
    assert [g.model for g in inv.gpus] == ["H100-SXM-80GB", "H100-SXM-80GB", "A100-SXM-80GB"]
    assert inv.gpus[0].match in ("GPU 'NVIDIA H100 80GB HBM3' matched catalogue model H100-SXM-80GB", "GPU 'NVIDIA H100 80GB HBM3' is catalogue model H100-SXM-80GB")
    assert [g.mig for g in inv.gpus] == ["disabled", "enabled", "disabled"]
    assert inv.links == {"0-1": "nvlink", "0-2": "system", "1-2": "pcie-switch"}
    assert inv.by_model() == {"H100-SXM-80GB": 2, "A100-SXM-80GB": 1}


def test_unknown_gpu_name_says_it_matches_no_catalogue_model():
    inv = detect_nvml(fake_nvml([("Frobnicator X9000", 16384)]))
    assert inv.gpus[0].model is None
    assert "matches no catalogue model" in inv.gpus[0].match


def test_no_nvml_library_falls_back_to_rocm_then_nothing(monkeypatch):
    assert detect_nvml(fake_nvml([], fail_init=True)) is None
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_nvml([], fail_init=True))
    assert detect(rocm_run=lambda argv: "{}").source == "none"


def test_nvml_telemetry_reads_utilisation_temperature_and_power(monkeypatch):
    from providers.agent import inventory

    nvml = fake_nvml([("NVIDIA L4", 23034)])
    t = inventory.telemetry_nvml(nvml)[0]
    assert (t.utilisation, t.temperature_c, t.power_w, t.memory_used_mib) == (55.0, 61.0, 312.5, 1024)


def test_rocm_smi_json_is_parsed_and_matched():
    out = {"card0": {"Card Series": "AMD Instinct MI300X", "VRAM Total Memory (B)": str(192 * 2**30), "Unique ID": "0xabc"}, "system": {"Driver version": "6.7.0"}}
    inv = detect_rocm(lambda argv: json.dumps(out))
    assert inv.source == "rocm-smi" and inv.gpus[0].model == "MI300X-192GB" and inv.gpus[0].vendor == "amd"


def test_declared_toml_inventory_with_explicit_and_matched_models(tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text(
        'driver_version = "550.54"\nhost = "rack7"\n'
        '[[gpus]]\nname = "NVIDIA H100 80GB HBM3"\nmemory_mib = 81559\n'
        '[[gpus]]\nname = "Some OEM name"\nmodel = "H100-SXM-80GB"\n[gpus.simulate]\nbusy_utilisation = 88\n'
        '[[links]]\na = 0\nb = 1\nkind = "nvlink"\n'
    )
    inv = load_declared(path)
    assert [g.model for g in inv.gpus] == ["H100-SXM-80GB", "H100-SXM-80GB"]
    assert inv.gpus[1].match == "GPU 'Some OEM name' declared as catalogue model H100-SXM-80GB"
    assert inv.gpus[0].uuid != inv.gpus[1].uuid and inv.interconnect == "nvlink"
    t = simulated_telemetry(inv, busy=[1])
    assert t[0].utilisation == 0 and t[1].utilisation == 88 and t[1].power_w > t[0].power_w


@pytest.mark.parametrize("raw,msg", [
    ({}, "non-empty"),
    ({"gpus": [{"memory_mib": 1}]}, "needs a 'name'"),
    ({"gpus": [{"name": "x", "model": "NOPE"}]}, "needs memory_mib"),
    ({"gpus": [{"name": "x", "memory_mib": 1024, "model": "NOPE"}]}, "not a catalogue model"),
    ({"gpus": [{"name": "L4", "memory_mib": 23034, "index": 0}, {"name": "L4", "memory_mib": 23034, "index": 0}]}, "unique"),
])
def test_bad_declared_inventories_are_refused_with_a_reason(raw, msg):
    with pytest.raises(InventoryError, match=msg):
        declared_inventory(raw)
