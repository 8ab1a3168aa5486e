"""Safe access to model files: root containment, safetensors header checks, pickle refusal.

Everything here runs before any tensor is allocated, so a hostile or broken file is refused
with a clear code (path_outside_roots, unsafe_weights, weights_too_large, weights_missing)
instead of crashing or exhausting memory. Messages never contain absolute paths.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import threading
from dataclasses import dataclass

from .catalog import Catalog, Entry
from .errors import WorkerError

# Beside a model that set-up could not make: a file with this suffix holds the reason
# (written by tpu_worker.builtin, read here so the load error says why).
UNAVAILABLE_SUFFIX = ".unavailable"

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# The safetensors reference implementation caps the header at 100 MB; so do we.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
MAX_TENSORS = 200_000
DEFAULT_MAX_WEIGHT_BYTES = 256 * 1024**3

SAFETENSORS_DTYPES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class WeightsInfo:
    """What the headers say, computed without reading tensor data."""

    files: tuple[str, ...]  # realpaths, sorted
    parameters: int
    weight_bytes: int
    tensors: int
    model_dir: str  # realpath of the directory holding config/tokenizer files


def _display(entry: Entry) -> str:
    p = entry.source.path or ""
    return p if p and not os.path.isabs(p) else f"the source of {entry.id!r}"


def inside(path: str, root: str) -> bool:
    """Whether realpath `path` lies inside realpath `root` (a sibling prefix does not count)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives / mix of absolute and relative
        return False


def resolve_source(entry: Entry, catalog: Catalog) -> str:
    """Realpath of the entry's files, refusing anything outside the model roots."""
    if entry.source.path is None:
        raise WorkerError(
            "weights_missing",
            f"model {entry.id!r} names a hub source; this worker reads only local files. Download "
            "the pinned revision into a model root and set source.path",
        )
    raw = entry.source.path
    joined = raw if os.path.isabs(raw) else os.path.join(catalog.roots[0], raw)
    real = os.path.realpath(joined)
    if not any(inside(real, root) for root in catalog.roots):
        raise WorkerError(
            "path_outside_roots",
            f"model {entry.id!r}: {_display(entry)} resolves outside the configured model roots "
            "(through '..', an absolute path or a symlink); move the files under a model root",
        )
    if not os.path.exists(real):
        # The set-up leaves a note beside a built-in it could not make (tpu_worker.builtin).
        note = _unavailable_note(real)
        if note:
            raise WorkerError("weights_missing", f"model {entry.id!r} is unavailable: {note}")
        raise WorkerError(
            "weights_missing",
            f"model {entry.id!r}: {_display(entry)} does not exist under the model root; for the "
            "built-in models run `npm run setup` (python -m tpu_worker.builtin --out .data/models)",
        )
    return real


def _unavailable_note(real: str) -> str | None:
    try:
        with open(real + UNAVAILABLE_SUFFIX, encoding="utf-8") as fh:
            return fh.read(500).strip() or None
    except OSError:
        return None


def _check_inside(real: str, catalog: Catalog, entry: Entry, name: str) -> None:
    if not any(inside(real, root) for root in catalog.roots):
        raise WorkerError(
            "path_outside_roots",
            f"model {entry.id!r}: file {name!r} is a link that points outside the model roots",
        )


def weight_files(entry: Entry, catalog: Catalog) -> tuple[list[str], str]:
    """(weight file realpaths, model dir realpath), enforcing the format's safety rules."""
    real = resolve_source(entry, catalog)
    if os.path.isdir(real):
        model_dir = real
        names = sorted(os.listdir(real))
        st = [n for n in names if n.endswith(".safetensors")]
        pk = [n for n in names if n.endswith(PICKLE_SUFFIXES) and n != "training_args.bin"]
        if entry.format == "pytorch":
            candidates = pk
        elif entry.format == "hf-safetensors":
            candidates = st
        else:
            raise WorkerError(
                "invalid_argument",
                f"model {entry.id!r}: format 'safetensors' needs source.path to name one .safetensors file",
            )
        if not candidates:
            if pk and entry.format != "pytorch":
                raise WorkerError(
                    "unsafe_weights",
                    f"model {entry.id!r} has only pickle weights ({', '.join(pk)}); convert them to "
                    "safetensors, or set format 'pytorch' and trusted: true if you trust the source",
                )
            raise WorkerError("weights_missing", f"model {entry.id!r}: no weight files found in {_display(entry)}")
        files = [os.path.realpath(os.path.join(real, n)) for n in candidates]
        for name, f in zip(candidates, files, strict=True):
            _check_inside(f, catalog, entry, name)
    else:
        model_dir = os.path.dirname(real)
        files = [real]
        if entry.format == "hf-safetensors":
            raise WorkerError(
                "invalid_argument",
                f"model {entry.id!r}: format 'hf-safetensors' needs source.path to name a directory",
            )
        is_pickle = real.endswith(PICKLE_SUFFIXES)
        if entry.format == "safetensors" and not real.endswith(".safetensors"):
            raise WorkerError(
                "unsafe_weights" if is_pickle else "invalid_argument",
                f"model {entry.id!r}: format 'safetensors' needs a .safetensors file; pickle files are "
                "refused (set format 'pytorch' and trusted: true only for sources you trust)",
            )
    if entry.format == "pytorch" and not entry.trusted:
        raise WorkerError(
            "unsafe_weights",
            f"model {entry.id!r} uses pickle weights, which can run code when loaded; convert them "
            "to safetensors, or mark the catalog entry trusted: true if you trust the source",
        )
    return files, model_dir


def read_safetensors_header(path: str, *, max_total_bytes: int = DEFAULT_MAX_WEIGHT_BYTES) -> tuple[dict, int]:
    """Parses and cross-checks a safetensors header; returns (tensor table, data bytes).

    Checks, before anything is allocated: header length fits the file and the cap; JSON is an
    object of well-formed entries; each entry's byte range matches dtype x shape; ranges are
    contiguous, non-overlapping and cover the data section exactly; totals stay under limits.
    """
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise WorkerError("unsafe_weights", f"{name}: file is too small to be safetensors")
            (n,) = struct.unpack("<Q", prefix)
            if n == 0 or n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise WorkerError(
                    "unsafe_weights",
                    f"{name}: header length {n} is invalid for a {size}-byte file (corrupt or not safetensors)",
                )
            raw = fh.read(n)
    except OSError as exc:
        raise WorkerError("weights_missing", f"{name}: cannot be read ({exc.strerror})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WorkerError("unsafe_weights", f"{name}: header is not valid JSON (corrupt file)") from None
    if not isinstance(header, dict):
        raise WorkerError("unsafe_weights", f"{name}: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ):
        raise WorkerError("unsafe_weights", f"{name}: __metadata__ must map strings to strings")
    if len(header) > MAX_TENSORS:
        raise WorkerError("weights_too_large", f"{name}: {len(header)} tensors exceed the limit of {MAX_TENSORS}")
    data_len = size - 8 - n
    ranges = []
    for key, t in header.items():
        if not (
            isinstance(t, dict)
            and t.get("dtype") in SAFETENSORS_DTYPES
            and isinstance(t.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in t["shape"])
            and isinstance(t.get("data_offsets"), list)
            and len(t["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in t["data_offsets"])
        ):
            raise WorkerError("unsafe_weights", f"{name}: tensor {key[:80]!r} has a malformed header entry")
        begin, end = t["data_offsets"]
        need = math.prod(t["shape"]) * SAFETENSORS_DTYPES[t["dtype"]]
        if begin < 0 or end < begin or end - begin != need:
            raise WorkerError(
                "unsafe_weights",
                f"{name}: tensor {key[:80]!r} declares {end - begin} bytes but its shape and dtype need {need}",
            )
        ranges.append((begin, end))
    ranges.sort()
    pos = 0
    for begin, end in ranges:
        if begin != pos:
            raise WorkerError("unsafe_weights", f"{name}: tensor byte ranges overlap or leave holes (corrupt file)")
        pos = end
    if pos > max_total_bytes:
        raise WorkerError(
            "weights_too_large",
            f"{name}: {pos} bytes of weights exceed this worker's limit of {max_total_bytes} bytes",
        )
    if pos != data_len:
        raise WorkerError(
            "unsafe_weights",
            f"{name}: header describes {pos} data bytes but the file holds {data_len} (truncated or padded)",
        )
    return header, pos


def inspect_weights(entry: Entry, catalog: Catalog, *, max_total_bytes: int = DEFAULT_MAX_WEIGHT_BYTES) -> WeightsInfo:
    files, model_dir = weight_files(entry, catalog)
    params = total = count = 0
    for f in files:
        if f.endswith(".safetensors"):
            header, nbytes = read_safetensors_header(f, max_total_bytes=max_total_bytes - total)
            count += len(header)
            total += nbytes
            # Parameters are the floating-point tensors; integer buffers (position ids) are not.
            params += sum(math.prod(t["shape"]) for t in header.values() if t["dtype"].startswith(("F", "BF")))
        else:
            # Trusted pickle: size from the file, parameters unknown until loaded.
            nbytes = os.path.getsize(f)
            if total + nbytes > max_total_bytes:
                raise WorkerError("weights_too_large", f"model {entry.id!r}: weights exceed {max_total_bytes} bytes")
            total += nbytes
    return WeightsInfo(tuple(files), params, total, count, model_dir)


def load_state_dict(info: WeightsInfo, entry: Entry) -> dict:
    """Loads tensors on the CPU; safetensors by default, pickle only when trusted and weights-only."""
    state: dict = {}
    for f in info.files:
        if f.endswith(".safetensors"):
            from safetensors.torch import load_file

            state.update(load_file(f, device="cpu"))
        else:
            if not entry.trusted:  # defence in depth; weight_files already refused this
                raise WorkerError("unsafe_weights", f"model {entry.id!r}: pickle weights need trusted: true")
            import pickle

            import torch

            try:
                # weights_only=True restricts unpickling to tensors and plain containers. There is
                # deliberately no fallback to weights_only=False.
                loaded = torch.load(f, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError:
                raise WorkerError(
                    "unsafe_weights",
                    f"model {entry.id!r}: {os.path.basename(f)} contains objects other than tensors and "
                    "was refused; convert it to safetensors",
                ) from None
            if isinstance(loaded, dict) and "state_dict" in loaded and isinstance(loaded["state_dict"], dict):
                loaded = loaded["state_dict"]
            if not isinstance(loaded, dict):
                raise WorkerError("unsafe_weights", f"model {entry.id!r}: the pickle file is not a state dict")
            state.update(loaded)
    return state


class DigestCache:
    """sha256 of weight files, recomputed only when a file's (size, mtime) changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, int, str]] = {}

    def file_digest(self, path: str) -> str:
        st = os.stat(path)
        key = (st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
            if hit and hit[:2] == key:
                return hit[2]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        digest = h.hexdigest()
        with self._lock:
            self._cache[path] = (*key, digest)
        return digest

    def digest(self, files: tuple[str, ...]) -> str:
        if len(files) == 1:
            return "sha256:" + self.file_digest(files[0])
        h = hashlib.sha256()
        for f in files:  # files are sorted, so the combined digest is stable
            h.update(os.path.basename(f).encode() + b"\0" + self.file_digest(f).encode() + b"\n")
        return "sha256:" + h.hexdigest()
