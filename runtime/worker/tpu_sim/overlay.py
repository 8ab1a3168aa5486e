"""A broken TorchTPU install for the simulated host: a venv that sees .venv-tpu's packages
except some (as if never installed) and the project's torch; optionally torch's package metadata
says another version (only the metadata: the torch that imports is still the project's).

    python -m tpu_sim.overlay DIR TPU_PYTHON [--hide libtpu,zmq] [--torch-version 2.9.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import setup_env


def overlay_python(tpu_python: str, where: str, hide: tuple[str, ...] = (), torch_version: str | None = None) -> str:
    """A venv that sees .venv-tpu's packages except `hide` (as if never installed), and the
    project's torch; with `torch_version`, torch's package metadata says that version instead."""
    tpu_site = setup_env.site_packages(tpu_python)
    with open(os.path.join(tpu_site, "tpu_mcp_project_venv.pth"), encoding="utf-8") as fh:
        project_site = fh.read().strip()
    site = os.path.join(where, "site")
    os.makedirs(site)
    for name in os.listdir(tpu_site):
        low = name.lower()
        if name.endswith(".pth") or any(low == h or low.startswith((h + "-", h + ".")) for h in hide):
            continue
        os.symlink(os.path.join(tpu_site, name), os.path.join(site, name))
    if torch_version:
        meta = os.path.join(site, f"torch-{torch_version}.dist-info")
        os.makedirs(meta)
        with open(os.path.join(meta, "METADATA"), "w", encoding="utf-8") as fh:
            fh.write(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    env_dir = os.path.join(where, "venv")
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", env_dir], check=True)
    py = os.path.join(env_dir, "bin", "python")
    with open(os.path.join(setup_env.site_packages(py), "overlay.pth"), "w", encoding="utf-8") as fh:
        fh.write(f"{site}\n{project_site}\n")
    return py


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("tpu_python")
    p.add_argument("--hide", default="")
    p.add_argument("--torch-version", default=None)
    a = p.parse_args()
    hide = tuple(h for h in a.hide.split(",") if h)
    print(overlay_python(a.tpu_python, a.dir, hide, a.torch_version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
