"""The host an agent reports (issue 32): read from the operating system, or as declared."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from providers.agent.host import cpu_model, host_facts
from providers.agent.inventory import InventoryError, declared_inventory

GPUS = [{"name": "NVIDIA A10", "memory_mib": 23028}, {"name": "NVIDIA A10", "memory_mib": 23028}]


def test_the_host_is_what_the_operating_system_says(tmp_path):
    inv = declared_inventory({"cuda_version": "12.4", "driver_version": "550.54.15", "gpus": GPUS, "links": [{"a": 0, "b": 1, "kind": "nvlink"}]})
    facts = host_facts(home=tmp_path, inv=inv, runtime="process", net_down_mbps=941.6, net_up_mbps=None)
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
    assert facts["cpu_model"] == " ".join(names[0].split()) if names else facts["cpu_model"] == cpu_model()
    assert facts["cpu_cores"] == len(os.sched_getaffinity(0))
    assert facts["ram_gib"] == round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30) > 0
    assert abs(facts["disk_gb"] - shutil.disk_usage(tmp_path).free // 10**9) <= 1, "the jobs folder's disk, though it does not exist yet"
    assert (facts["cuda_version"], facts["driver_version"], facts["runtime"], facts["topology"]) == ("12.4", "550.54.15", "process", {"0-1": "nvlink"})
    assert facts["net_down_mbps"] == 942 and "net_up_mbps" not in facts, "not measured: left out, not made up"


def test_a_declared_machine_describes_its_host(tmp_path):
    inv = declared_inventory({"gpus": GPUS, "machine": {"cpu_model": "AMD EPYC 9454", "ram_gib": 512, "disk_gb": 2000}})
    facts = host_facts(home=tmp_path, inv=inv, runtime="docker")
    assert (facts["cpu_model"], facts["ram_gib"], facts["disk_gb"]) == ("AMD EPYC 9454", 512, 2000)
    assert facts["cpu_cores"] == len(os.sched_getaffinity(0)), "what it does not declare is read"


@pytest.mark.parametrize("machine", [{"disk_gb": -1}, {"ram_gib": "lots"}, {"gpus": 2}, {"disk_gb": True}, ["disk_gb"]])
def test_a_bad_declared_machine_is_refused(machine):
    with pytest.raises(InventoryError, match="'machine' may declare"):
        declared_inventory({"gpus": GPUS, "machine": machine})


def test_lost_work_is_what_ran_since_the_newest_checkpoint_file(tmp_path):
    # issue 31: the part that resumes from a checkpoint does again what ran after it
    from providers.agent.daemon import lost_gpu_seconds

    ckpt = tmp_path / "checkpoint"
    assert lost_gpu_seconds(ckpt, 1000.0, 1100.0, 2, 200) == 200, "no checkpoint: all of it"
    (ckpt / "inner").mkdir(parents=True)
    old, new = ckpt / "old.pt", ckpt / "inner" / "new.pt"
    old.write_text("a")
    new.write_text("b")
    os.utime(old, (1010.0, 1010.0))
    os.utime(new, (1070.0, 1070.0))
    assert lost_gpu_seconds(ckpt, 1000.0, 1100.0, 2, 200) == 60, "30 s since the newest, on 2 GPUs"
    os.utime(new, (900.0, 900.0))
    os.utime(old, (900.0, 900.0))
    assert lost_gpu_seconds(ckpt, 1000.0, 1100.0, 2, 150) == 150, "a checkpoint older than the run: what ran, at most"
