"""Builds the fake sysfs/VFIO tree a simulated TPU host reads (see hook/sitecustomize.py)."""

from __future__ import annotations

import os

GOOGLE_VENDOR = "0x1ae0"
# TorchTPU 0.2.0 hardware.py PCI device ids.
DEVICE_IDS = {"v4": "0x005e", "v5p": "0x0062", "v5e": "0x0063", "v6e": "0x006f", "v7": "0x0076"}
HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook")


def make_host(root: str, chips: int = 4, generation: str = "v6e") -> str:
    """`chips` TPU PCI functions, each bound to VFIO (an iommu group with a /dev/vfio node)."""
    for i in range(chips):
        dev = os.path.join(root, "sys/bus/pci/devices", f"0000:00:{4 + i:02x}.0")
        group = os.path.join(root, "sys/kernel/iommu_groups", str(i))
        os.makedirs(dev, exist_ok=True)
        os.makedirs(group, exist_ok=True)
        os.makedirs(os.path.join(root, "dev/vfio"), exist_ok=True)
        with open(os.path.join(dev, "vendor"), "w", encoding="ascii") as fh:
            fh.write(GOOGLE_VENDOR + "\n")
        with open(os.path.join(dev, "device"), "w", encoding="ascii") as fh:
            fh.write(DEVICE_IDS[generation] + "\n")
        link = os.path.join(dev, "iommu_group")
        if not os.path.islink(link):
            os.symlink(os.path.relpath(group, dev), link)
        open(os.path.join(root, "dev/vfio", str(i)), "a").close()
    # Also a non-Google device, which the scan must skip.
    other = os.path.join(root, "sys/bus/pci/devices", "0000:00:01.0")
    os.makedirs(other, exist_ok=True)
    with open(os.path.join(other, "vendor"), "w", encoding="ascii") as fh:
        fh.write("0x8086\n")
    return root


def sim_env(root: str, base: dict | None = None) -> dict:
    """The environment of a process on the simulated host."""
    env = dict(os.environ if base is None else base)
    env["TPU_SIM_ROOT"] = root
    # The server's look for chips (runtime/pool/inventory.ts) reads this ordinary setting.
    env["TPU_MCP_DEV_DIR"] = os.path.join(root, "dev")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HOOK, env.get("PYTHONPATH")) if p)
    # libtpu would otherwise spend minutes asking the GCE metadata server for the TPU topology
    # before it finds no chip (only reached when a tensor is allocated on `tpu`).
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    env.setdefault("TPU_WORKER_TCMALLOC", "0")
    return env


if __name__ == "__main__":  # python -m tpu_sim.host ROOT [CHIPS] [GENERATION]
    import sys

    print(make_host(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4, *(sys.argv[3:4] or ["v6e"])))
