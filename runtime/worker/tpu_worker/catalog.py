"""The model catalog (JSON shared by the server and the worker), validated field by field."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

TASKS = ("embedding", "text-generation", "tensor", "classification")
ARCHITECTURES = {
    "sentence-transformer": ("embedding",),
    "causal-lm": ("text-generation",),
    "mnist-cnn": ("tensor", "classification"),
}
FORMATS = ("safetensors", "hf-safetensors", "pytorch")
# Who runs the model: "torch" = this worker's own PyTorch adapters; "vllm" = a vLLM server the
# worker starts and supervises (tpu_worker/engines), for causal LMs in Hugging Face layout.
ENGINES = ("torch", "vllm")
MODEL_DTYPES = ("float32", "bfloat16", "float16")
INPUT_DTYPES = ("float32", "float16", "bfloat16")
MAX_LOGPROBS = 5  # the generation contract's bound on args.logprobs
_KEPT_RE = re.compile(r"^kept-[0-9a-f]{12}$")
_SHA_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_REV_RE = re.compile(r"^[0-9a-f]{40}$")
_HUB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class CatalogError(ValueError):
    """The catalog file is unusable; the message names the field and what to fix."""


@dataclass(frozen=True)
class Limits:
    max_batch: int
    max_seq_len: int
    max_new_tokens: int
    max_text_chars: int
    # Top alternatives a generation may return per token (args.logprobs); 0 turns logprobs off.
    max_logprobs: int = 5


@dataclass(frozen=True)
class Batching:
    max_batch: int
    max_wait_ms: float


@dataclass(frozen=True)
class Shapes:
    """The entry's shape plan buckets (tpu_worker/shapes.py); None: the defaults."""

    batch_buckets: tuple[int, ...] | None = None
    length_buckets: tuple[int, ...] | None = None
    # A compile or a new op shape after the load's warm-up fails the call (census.py), not only counted.
    strict: bool = False


# A text-generation model's prefix cache (generation/prefix.py): the bytes of prompt-prefix keys
# and values kept for reuse (0 turns it off), in blocks of `block_tokens` tokens.
DEFAULT_PREFIX_CACHE_BYTES = 64 * 1024**2
DEFAULT_PREFIX_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class PrefixCacheSpec:
    max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    block_tokens: int = DEFAULT_PREFIX_BLOCK_TOKENS


@dataclass(frozen=True)
class Source:
    path: str | None = None
    hub: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Entry:
    id: str
    task: str
    architecture: str
    description: str
    source: Source
    format: str
    trusted: bool
    dtypes: tuple[str, ...]
    default_dtype: str
    limits: Limits
    batching: Batching
    input: InputSpec | None
    labels: tuple[str, ...] | None = None
    engine: str = "torch"
    shapes: Shapes = Shapes()
    prefix_cache: PrefixCacheSpec = PrefixCacheSpec()
    # "sha256:<hex>" of the weight files (loaders.DigestCache.digest): a load checks it first.
    sha256: str | None = None


@dataclass(frozen=True)
class Catalog:
    path: str
    roots: tuple[str, ...]  # realpaths
    entries: dict[str, Entry]
    # The server's folder of kept fine-tunes (data_dir/kept, keep.py): its index.json names them.
    kept_dir: str | None = None

    def get(self, model_id: Any) -> Entry:
        from .errors import WorkerError

        if isinstance(model_id, str) and model_id in self.entries:
            return self.entries[model_id]
        kept = self.kept(model_id)
        if kept is not None:
            return kept
        known = ", ".join(sorted(self.entries)) or "none"
        raise WorkerError("unknown_model", f"model {model_id!r} is not in the catalog (known: {known})")

    def kept(self, model_id: Any) -> Entry | None:
        """A kept fine-tune's entry, read from the index at each use: the server adds and sweeps
        them while this worker runs (whose principal may use one is the server's check)."""
        if not isinstance(model_id, str) or not _KEPT_RE.match(model_id):
            return None
        return self.kept_entries().get(model_id)

    def kept_entries(self) -> dict[str, Entry]:
        """Every kept fine-tune the server's index names now (none without a kept folder)."""
        if self.kept_dir is None:
            return {}
        try:
            with open(os.path.join(self.kept_dir, "index.json"), encoding="utf-8") as fh:
                records = json.load(fh).get("models") or []
        except (OSError, ValueError, AttributeError):
            return {}
        out: dict[str, Entry] = {}
        for r in records:
            raw = r.get("entry") if isinstance(r, dict) else None
            if isinstance(raw, dict) and isinstance(raw.get("id"), str) and _KEPT_RE.match(raw["id"]):
                out[raw["id"]] = parse_entry(raw, f"kept[{raw['id']}]")
        return out


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise CatalogError(f"catalog: {where}: {what}")


def _int(obj: dict, key: str, where: str, *, minimum: int = 0, default: int | None = None) -> int:
    v = obj.get(key, default)
    _need(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
        f"{where}.{key}",
        f"expected an integer >= {minimum}",
    )
    return v


def _str(obj: dict, key: str, where: str, *, default: str | None = None) -> str:
    v = obj.get(key, default)
    _need(isinstance(v, str) and v != "", f"{where}.{key}", "expected a non-empty string")
    return v


def parse_entry(raw: Any, where: str) -> Entry:
    _need(isinstance(raw, dict), where, "expected an object")
    model_id = _str(raw, "id", where)
    _need(bool(_ID_RE.match(model_id)), f"{where}.id", "use 1-64 lowercase letters, digits, '.', '_' or '-'")
    where = f"models[{model_id}]"
    arch = _str(raw, "architecture", where)
    _need(arch in ARCHITECTURES, f"{where}.architecture", f"expected one of {', '.join(ARCHITECTURES)}")
    task = _str(raw, "task", where)
    _need(
        task in ARCHITECTURES[arch],
        f"{where}.task",
        f"architecture {arch} serves task(s) {', '.join(ARCHITECTURES[arch])}",
    )
    fmt = _str(raw, "format", where)
    _need(fmt in FORMATS, f"{where}.format", f"expected one of {', '.join(FORMATS)}")
    trusted = raw.get("trusted", False)
    _need(isinstance(trusted, bool), f"{where}.trusted", "expected true or false")

    src = raw.get("source")
    _need(isinstance(src, dict), f"{where}.source", 'expected {"path": ...} or {"hub": ..., "revision": ...}')
    if "path" in src:
        path = _str(src, "path", f"{where}.source")
        _need("\x00" not in path, f"{where}.source.path", "contains a NUL byte")
        source = Source(path=path)
    else:
        hub = _str(src, "hub", f"{where}.source")
        _need(bool(_HUB_RE.match(hub)), f"{where}.source.hub", 'expected "org/name"')
        rev = _str(src, "revision", f"{where}.source")
        _need(bool(_REV_RE.match(rev)), f"{where}.source.revision", "expected a 40-hex commit id")
        source = Source(hub=hub, revision=rev)

    dtypes = raw.get("dtypes", ["float32"])
    _need(
        isinstance(dtypes, list)
        and dtypes
        and all(d in MODEL_DTYPES for d in dtypes)
        and len(set(dtypes)) == len(dtypes),
        f"{where}.dtypes",
        f"expected a non-empty list of distinct values from {', '.join(MODEL_DTYPES)}",
    )
    default_dtype = _str(raw, "default_dtype", where, default=dtypes[0])
    _need(default_dtype in dtypes, f"{where}.default_dtype", "must be one of the entry's dtypes")

    lim = raw.get("limits", {})
    _need(isinstance(lim, dict), f"{where}.limits", "expected an object")
    limits = Limits(
        max_batch=_int(lim, "max_batch", f"{where}.limits", minimum=1, default=1),
        max_seq_len=_int(lim, "max_seq_len", f"{where}.limits", default=0),
        max_new_tokens=_int(lim, "max_new_tokens", f"{where}.limits", default=0),
        max_text_chars=_int(lim, "max_text_chars", f"{where}.limits", default=0),
        max_logprobs=_int(lim, "max_logprobs", f"{where}.limits", default=MAX_LOGPROBS),
    )
    _need(limits.max_logprobs <= MAX_LOGPROBS, f"{where}.limits.max_logprobs", f"must be 0..{MAX_LOGPROBS}")
    if task in ("embedding", "text-generation"):
        _need(
            limits.max_seq_len > 0 and limits.max_text_chars > 0,
            f"{where}.limits",
            "text models need max_seq_len and max_text_chars > 0",
        )
    if task == "text-generation":
        _need(limits.max_new_tokens > 0, f"{where}.limits.max_new_tokens", "must be > 0 for text generation")

    bat = raw.get("batching", {"max_batch": 1, "max_wait_ms": 0})
    _need(isinstance(bat, dict), f"{where}.batching", "expected an object")
    wait = bat.get("max_wait_ms", 0)
    _need(
        isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 <= wait <= 1000,
        f"{where}.batching.max_wait_ms",
        "expected a number of milliseconds in 0..1000",
    )
    batching = Batching(_int(bat, "max_batch", f"{where}.batching", minimum=1, default=1), float(wait))
    _need(batching.max_batch <= limits.max_batch, f"{where}.batching.max_batch", "must not exceed limits.max_batch")

    spec = None
    if task in ("tensor", "classification"):
        inp = raw.get("input")
        _need(isinstance(inp, dict), f"{where}.input", 'tensor models need {"shape": [...], "dtype": ...}')
        shape = inp.get("shape")
        _need(
            isinstance(shape, list)
            and 0 < len(shape) <= 6
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape),
            f"{where}.input.shape",
            "expected 1-6 positive integers (the per-item shape, no batch dim)",
        )
        dt = inp.get("dtype", "float32")
        _need(dt in INPUT_DTYPES, f"{where}.input.dtype", f"expected one of {', '.join(INPUT_DTYPES)}")
        spec = InputSpec(tuple(shape), dt)

    labels = raw.get("labels")
    if labels is not None:
        _need(
            isinstance(labels, list) and all(isinstance(x, str) for x in labels),
            f"{where}.labels",
            "expected a list of strings",
        )
        labels = tuple(labels)

    engine = raw.get("engine", "torch")
    _need(engine in ENGINES, f"{where}.engine", f"expected one of {', '.join(ENGINES)}")
    if engine == "vllm":
        _need(
            arch == "causal-lm" and fmt == "hf-safetensors",
            f"{where}.engine",
            'engine "vllm" serves causal-lm models in hf-safetensors format',
        )

    shapes = _shapes(raw.get("shapes"), f"{where}.shapes", limits)
    prefix_cache = _prefix_cache(raw.get("prefix_cache"), f"{where}.prefix_cache")

    description = raw.get("description", "")
    _need(isinstance(description, str), f"{where}.description", "expected a string")
    sha256 = raw.get("sha256")
    _need(
        sha256 is None or (isinstance(sha256, str) and bool(_SHA_RE.match(sha256))),
        f"{where}.sha256",
        'expected "sha256:" and 64 hex digits (the digest of the weight files)',
    )
    return Entry(
        model_id,
        task,
        arch,
        description,
        source,
        fmt,
        trusted,
        tuple(dtypes),
        default_dtype,
        limits,
        batching,
        spec,
        labels,
        engine,
        shapes,
        prefix_cache,
        sha256,
    )


def _buckets(raw: Any, where: str, top: int) -> tuple[int, ...] | None:
    if raw is None:
        return None
    _need(
        isinstance(raw, list)
        and 0 < len(raw) <= 16
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= top for v in raw)
        and raw == sorted(set(raw)),
        where,
        f"expected 1-16 ascending distinct integers in 1..{top}",
    )
    return tuple(raw)


def _shapes(raw: Any, where: str, limits: Limits) -> Shapes:
    if raw is None:
        return Shapes()
    _need(isinstance(raw, dict), where, "expected an object {batch_buckets?, length_buckets?, strict?}")
    unknown = set(raw) - {"batch_buckets", "length_buckets", "strict"}
    _need(not unknown, where, f"unknown key {sorted(unknown)[0] if unknown else ''!r}")
    strict = raw.get("strict", False)
    _need(isinstance(strict, bool), f"{where}.strict", "expected true or false")
    return Shapes(
        _buckets(raw.get("batch_buckets"), f"{where}.batch_buckets", limits.max_batch),
        _buckets(raw.get("length_buckets"), f"{where}.length_buckets", max(limits.max_seq_len, 1)),
        strict,
    )


def _prefix_cache(raw: Any, where: str) -> PrefixCacheSpec:
    if raw is None:
        return PrefixCacheSpec()
    _need(isinstance(raw, dict), where, "expected an object {max_bytes?, block_tokens?}")
    unknown = set(raw) - {"max_bytes", "block_tokens"}
    _need(not unknown, where, f"unknown key {sorted(unknown)[0] if unknown else ''!r}")
    block = _int(raw, "block_tokens", where, minimum=1, default=DEFAULT_PREFIX_BLOCK_TOKENS)
    _need(block <= 1024, f"{where}.block_tokens", "expected 1..1024 tokens")
    return PrefixCacheSpec(_int(raw, "max_bytes", where, default=DEFAULT_PREFIX_CACHE_BYTES), block)


def parse_catalog(data: Any, path: str, kept_dir: str | None = None) -> Catalog:
    _need(isinstance(data, dict), "top level", "expected an object with model_roots and models")
    base = os.path.dirname(os.path.abspath(path))
    roots_raw = data.get("model_roots")
    _need(
        isinstance(roots_raw, list) and roots_raw and all(isinstance(r, str) and r for r in roots_raw),
        "model_roots",
        "expected a non-empty list of directory paths",
    )
    # Roots are realpath'd once so every later containment check compares canonical paths.
    roots = tuple(os.path.realpath(os.path.join(base, r)) for r in roots_raw)
    models = data.get("models")
    _need(isinstance(models, list), "models", "expected a list")
    entries: dict[str, Entry] = {}
    for i, raw in enumerate(models):
        entry = parse_entry(raw, f"models[{i}]")
        _need(entry.id not in entries, f"models[{i}].id", f"duplicate id {entry.id!r}")
        entries[entry.id] = entry
    if kept_dir is not None:
        # The kept fine-tunes' folder is a model root: their files are checked like any model's.
        kept_dir = os.path.realpath(kept_dir)
        roots = (*roots, kept_dir)
    return Catalog(os.path.abspath(path), roots, entries, kept_dir)


def load_catalog(path: str, kept_dir: str | None = None) -> Catalog:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise CatalogError(f"catalog file cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise CatalogError(f"catalog is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return parse_catalog(data, path, kept_dir)
