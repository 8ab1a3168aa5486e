"""Text datasets for the benchmark's work "fine_tune", declared in the catalog as models are.

The catalog's `datasets` list names each one: {id, format ("text" | "jsonl"), path, sha256,
description?, license?, origin?}. `path` is relative to one of the catalog's `dataset_roots`
(folders relative to the catalog file), and the file must be inside one after symlinks are
resolved. Its sha256 is checked before every use: a file that changed since it was declared is
refused, never trained on. "text" is one document; "jsonl" is one JSON object per line, its
"text" field a document.

The documents are tokenised with the model's own tokenizer (its EOS between documents), the
token stream cut into blocks of the shape plan's length bucket (no padding: every token of a
block is real), and the blocks split in order: the last `HELDOUT_FRACTION` (at least one batch
bucket of blocks) are held out, never trained on; the rest are the training blocks. A split in
order keeps the held-out text apart from the training text (no block shares a sentence with a
held-out one but at the cut).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch

from ..errors import WorkerError, invalid

FORMATS = ("text", "jsonl")
HELDOUT_FRACTION = 0.1
MAX_BYTES = 64 * 1024**2  # a fine-tune's text, read whole: a sanity bound


@dataclass(frozen=True)
class Dataset:
    id: str
    format: str
    path: str  # resolved, inside a dataset root
    sha256: str
    description: str
    license: str | None
    origin: str | None

    def report(self) -> dict:
        return {
            "id": self.id,
            "format": self.format,
            "sha256": self.sha256,
            "description": self.description,
            "license": self.license,
            "origin": self.origin,
        }


def declared(catalog_path: str) -> dict[str, dict]:
    """The catalog file's dataset entries by id, as written (read at use: the catalog the worker
    was started with may add datasets without a model change)."""
    try:
        with open(catalog_path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise invalid(f"the catalog {catalog_path} cannot be read for its datasets ({exc})") from None
    raw = data.get("datasets") or []
    if not isinstance(raw, list):
        raise invalid("catalog: datasets must be a list of {id, format, path, sha256}")
    return {d["id"]: d for d in raw if isinstance(d, dict) and isinstance(d.get("id"), str)}


def resolve(catalog_path: str, dataset_id: str) -> Dataset:
    """The declared dataset `dataset_id`, its file inside a dataset root and its digest checked."""
    entries = declared(catalog_path)
    raw = entries.get(dataset_id)
    if raw is None:
        known = ", ".join(sorted(entries)) or "none"
        raise invalid(f"args.dataset: {dataset_id!r} is not a catalog dataset (known: {known})")
    where = f"catalog datasets[{dataset_id}]"
    fmt, rel, digest = raw.get("format"), raw.get("path"), raw.get("sha256")
    if fmt not in FORMATS:
        raise invalid(f"{where}.format must be one of {', '.join(FORMATS)}")
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise invalid(f"{where}.path must be a file path relative to a dataset root")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise invalid(f"{where}.sha256 must be the file's 64-hex sha256")
    base = os.path.dirname(os.path.abspath(catalog_path))
    with open(catalog_path, encoding="utf-8") as fh:
        roots_raw = json.load(fh).get("dataset_roots") or []
    roots = [os.path.realpath(os.path.join(base, r)) for r in roots_raw if isinstance(r, str) and r]
    if not roots:
        raise invalid("catalog: dataset_roots must list the folders datasets are read from")
    path = None
    for root in roots:
        candidate = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([candidate, root]) == root and os.path.isfile(candidate):
            path = candidate
            break
    if path is None:
        raise WorkerError("path_outside_roots", f"{where}.path: no file {rel!r} inside the catalog's dataset_roots")
    if os.path.getsize(path) > MAX_BYTES:
        raise invalid(f"{where}: the file is over {MAX_BYTES} bytes; a fine-tune reads it whole")
    actual = file_sha256(path)
    if actual != digest:
        raise invalid(
            f"{where}: the file's sha256 is {actual}, the catalog declares {digest}; the file changed since it "
            "was declared: restore it, or have the operator declare the new digest"
        )
    return Dataset(
        dataset_id, fmt, path, digest, str(raw.get("description") or ""), raw.get("license"), raw.get("origin")
    )


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def documents(ds: Dataset) -> list[str]:
    with open(ds.path, encoding="utf-8") as fh:
        body = fh.read()
    if ds.format == "text":
        return [body]
    docs = []
    for n, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise invalid(f"dataset {ds.id}: line {n} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise invalid(f"dataset {ds.id}: line {n} has no string field 'text'")
        docs.append(row["text"])
    return docs


def token_stream(docs: list[str], tokenizer, eos_id: int | None) -> list[int]:
    """Every document's tokens (no special tokens added), the EOS id between documents."""
    ids: list[int] = []
    for enc in tokenizer.encode_batch(docs, add_special_tokens=False):
        if ids and eos_id is not None:
            ids.append(eos_id)
        ids.extend(enc.ids)
    return ids


@dataclass
class Split:
    train: torch.Tensor  # [n, length] token ids
    heldout: torch.Tensor  # [m, length]
    tokens: int  # of the whole stream

    def report(self, length: int, batch: int) -> dict:
        return {
            "tokens": self.tokens,
            "block_tokens": length,
            "batch_blocks": batch,
            "train_blocks": int(self.train.shape[0]),
            "heldout_blocks": int(self.heldout.shape[0]),
            "heldout_fraction": HELDOUT_FRACTION,
            "split": "in order: the last blocks held out, never trained on",
        }


def pack_and_split(ids: list[int], length: int, batch: int, dataset_id: str) -> Split:
    """Blocks of `length` tokens (the tail that fills no block dropped), the last
    max(HELDOUT_FRACTION of them, `batch`) held out, rounded down to whole batches."""
    n = len(ids) // length
    heldout = max(batch, int(n * HELDOUT_FRACTION)) // batch * batch
    if n - heldout < batch:
        raise invalid(
            f"dataset {dataset_id}: {len(ids)} tokens make {n} blocks of {length}; a fine-tune needs at least "
            f"{2 * batch} (one batch to train on, one held out): use a shorter seq_len or a smaller batch"
        )
    blocks = torch.tensor(ids[: n * length], dtype=torch.long).view(n, length)
    return Split(train=blocks[: n - heldout], heldout=blocks[n - heldout :], tokens=len(ids))
