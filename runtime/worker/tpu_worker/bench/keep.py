"""A fine-tune's result kept as a model (issue 47 item 2): the trained float32 weights of one
configuration written as safetensors in Hugging Face layout under the server's kept folder
(--kept-dir, data_dir/kept/<id>/), beside a copy of the base model's tokenizer and config files.

The base model's own folder is only read. The files are written into a temporary folder and
renamed into place, so a half-written result is never served. The digest returned is the one a
load of the kept entry checks (loaders.DigestCache over the weight files).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ..errors import WorkerError, invalid

# What the trained module's save writes itself; every other file of the base folder is copied.
_WRITTEN = ("config.json", "generation_config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".index.json")


def keep_weights(worker, model, source_dir: str, kept_id: str) -> dict:
    """Writes `model` (a trained copy) as kept model `kept_id`; {id, sha256, bytes, files}."""
    root = worker.catalog.kept_dir
    if root is None:
        raise invalid("args.keep: this worker was started without --kept-dir; nothing can be kept")
    final = os.path.join(root, kept_id)
    if os.path.exists(final):
        raise invalid(f"args.keep: {kept_id} exists already; keep under a new id")
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{kept_id}.", dir=root)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in sorted(os.listdir(source_dir)):
            src = os.path.join(source_dir, name)
            if name in _WRITTEN or name.endswith(_WEIGHT_SUFFIXES) or not os.path.isfile(src):
                continue
            shutil.copyfile(src, os.path.join(tmp, name))
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WorkerError("internal", f"the fine-tuned weights could not be written ({exc.strerror})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = tuple(
        sorted(os.path.realpath(os.path.join(final, f)) for f in os.listdir(final) if f.endswith(".safetensors"))
    )
    return {
        "id": kept_id,
        "sha256": worker.digests.digest(files),
        "bytes": sum(os.path.getsize(os.path.join(final, f)) for f in os.listdir(final)),
        "files": [os.path.basename(f) for f in files],
    }


__all__ = ["keep_weights"]
