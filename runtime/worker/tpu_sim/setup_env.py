"""Creates `.venv-tpu` for the simulated-TPU suite: the REAL torch-tpu wheel and its dependencies
(libtpu, pyzmq, ...) in a separate environment that sees the project's torch 2.13.0 through a
.pth file, so torch is never downloaded twice and the project's venv is never touched.

    .venv/bin/python runtime/worker/tpu_sim/setup_env.py [--root REPO]

Skipped quickly when the marker file says the same pins are installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import venv

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.join(HERE, "..", "extra", "requirements-tpu.txt")
MARKER = ".tpu-sim-ready"


def pins() -> list[str]:
    with open(REQUIREMENTS, encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]


def python_of(env_dir: str) -> str:
    return os.path.join(env_dir, "bin", "python")


def site_packages(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def ensure(root: str) -> str:
    """Returns the path of .venv-tpu's python, creating and filling it when needed."""
    project_python = os.path.join(root, ".venv", "bin", "python")
    env_dir = os.path.join(root, ".venv-tpu")
    project_site = os.path.realpath(site_packages(project_python))
    want = hashlib.sha256("\n".join([*pins(), project_site]).encode()).hexdigest()
    marker = os.path.join(env_dir, MARKER)
    if os.path.exists(marker):
        with open(marker, encoding="ascii") as fh:
            if fh.read().strip() == want:
                return python_of(env_dir)
    print(f"[tpu-sim] creating {env_dir} with {', '.join(pins())}", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True, symlinks=True).create(env_dir)
    py = python_of(env_dir)
    # The project's torch (and everything else in its venv) through a .pth: pip sees torch
    # 2.13.0 installed, which satisfies torch-tpu's torch>=2.11,<=2.15, and downloads no torch.
    with open(os.path.join(site_packages(py), "tpu_mcp_project_venv.pth"), "w", encoding="utf-8") as fh:
        fh.write(project_site + "\n")
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", REQUIREMENTS], check=True
    )
    check = subprocess.run(
        [py, "-c", "import importlib.metadata as m, torch; print(torch.__file__, m.version('torch-tpu'))"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    torch_file, tpu_version = check.stdout.split()
    if not os.path.realpath(torch_file).startswith(project_site):
        raise SystemExit(f"[tpu-sim] .venv-tpu imports torch from {torch_file}, not the project's venv")
    with open(marker, "w", encoding="ascii") as fh:
        fh.write(want + "\n")
    print(f"[tpu-sim] ready: torch-tpu {tpu_version} over {torch_file}", file=sys.stderr)
    return py


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", default=os.path.abspath(os.path.join(HERE, "..", "..", "..")))
    print(ensure(p.parse_args().root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
