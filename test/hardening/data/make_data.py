"""Writes the adversarial weight files kept in this folder (run once; the files are committed).

python3 make_data.py  — no torch needed; every file is a few hundred bytes.
"""

import json
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CANARY = "/tmp/tpu-mcp-pickle-canary-6a1f"


class Canary:
    """Unpickling this runs `touch CANARY`: the file must never appear."""

    def __reduce__(self):
        return (os.system, (f"touch {CANARY}",))


def write(name: str, data: bytes) -> None:
    with open(os.path.join(HERE, name), "wb") as fh:
        fh.write(data)


def safetensors(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


# A pickle that runs a shell command when loaded (torch.load's legacy format is a plain pickle).
write("canary.pt", pickle.dumps({"conv1.weight": Canary()}, protocol=2))
# Header length far beyond the file (and any sane cap): must be refused before allocating.
write("header_length_bomb.safetensors", struct.pack("<Q", 2**63 - 1) + b"{}")
# A well-formed header whose single tensor claims 4 PiB: refused as too large, nothing allocated.
n = 2**40 * 1024 * 4
write("header_shape_bomb.safetensors", safetensors({"w": {"dtype": "F32", "shape": [2**40, 1024], "data_offsets": [0, n]}}))
# Header that is not JSON.
write("header_not_json.safetensors", struct.pack("<Q", 16) + b"\xff\xfe not json \x00\x01\x02")
# Offsets that overlap (two tensors on the same bytes).
write(
    "header_overlap.safetensors",
    safetensors(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        },
        b"\x00" * 8,
    ),
)
print("written to", HERE)
