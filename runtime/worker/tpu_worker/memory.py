"""Memory estimates made before loading, so a model that cannot fit is refused up front."""

from __future__ import annotations

from .catalog import Entry

HEADROOM = 1.2
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GiB = 1024**3


def activation_bytes(entry: Entry, config: dict | None, dtype: str) -> int:
    """A deliberately generous allowance for activations at the entry's largest batch.

    Text encoders: ~16 live hidden-sized tensors per token plus one attention score matrix per
    head. Generation adds the KV cache for prompt + new tokens. Tensor models: the input and a
    few feature maps per item.
    """
    lim = entry.limits
    b = DTYPE_BYTES[dtype]
    cfg = config or {}
    if entry.task in ("embedding", "text-generation"):
        hidden = int(cfg.get("hidden_size") or cfg.get("n_embd") or 768)
        heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 12)
        layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 12)
        seq = lim.max_seq_len + lim.max_new_tokens
        tokens = lim.max_batch * seq
        act = tokens * hidden * b * 16 + lim.max_batch * heads * seq * seq * 4
        if entry.task == "text-generation":
            act += 2 * layers * tokens * hidden * b
            act += lim.max_batch * int(cfg.get("vocab_size", 32000)) * 4 * 2  # logits of the last step
        return int(act)
    items = 1
    for d in entry.input.shape if entry.input else (1,):
        items *= d
    return int(lim.max_batch * items * 4 * 64)


def estimate_bytes(parameters: int, entry: Entry, config: dict | None, dtype: str) -> int:
    return int(parameters * DTYPE_BYTES[dtype] * HEADROOM) + activation_bytes(entry, config, dtype)


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"


def refusal_message(
    *,
    model: str,
    dtype: str,
    need: int,
    free: int,
    device: str,
    alternatives: dict[str, int],
    loaded: list[tuple[str, int]],
) -> str:
    """Says what would fit: a smaller dtype, or which loaded models to unload."""
    msg = f"loading {model!r} as {dtype} needs about {fmt_bytes(need)} but {device} has {fmt_bytes(free)} free"
    fits = [d for d, n in sorted(alternatives.items(), key=lambda kv: kv[1]) if d != dtype and n <= free]
    hints = []
    if fits:
        d = fits[0]
        hints.append(f"use dtype {d} (needs about {fmt_bytes(alternatives[d])})")
    freed, names = 0, []
    for name, size in sorted(loaded, key=lambda kv: -kv[1]):
        if free + freed >= need:
            break
        freed += size
        names.append(name)
    if names and free + freed >= need:
        hints.append("unload " + ", ".join(repr(n) for n in names))
    if not hints:
        hints.append("use a device with more memory or a smaller model")
    return msg + ": " + " or ".join(hints)
