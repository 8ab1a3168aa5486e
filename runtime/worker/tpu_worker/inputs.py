"""Text inputs checked against a catalog entry's limits: one wording for every text model, the
worker's own adapters and the vLLM engine alike."""

from __future__ import annotations

from .catalog import Entry
from .errors import invalid


def check_texts(entry: Entry, args: dict) -> list[str]:
    texts = args.get("texts")
    lim = entry.limits
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid(f"model {entry.id!r} needs args.texts: a non-empty list of strings")
    if len(texts) > lim.max_batch:
        raise invalid(f"{len(texts)} texts exceed this model's max_batch of {lim.max_batch}; split the request")
    for i, t in enumerate(texts):
        if len(t) > lim.max_text_chars:
            raise invalid(f"texts[{i}] has {len(t)} characters; the limit is {lim.max_text_chars}")
    return texts


def seq_len_arg(args: dict, cap: int) -> int:
    """args.seq_len (2..cap), or `cap` when absent."""
    v = args.get("seq_len")
    if v is None:
        return cap
    if not isinstance(v, int) or isinstance(v, bool) or not 2 <= v <= cap:
        raise invalid(f"args.seq_len must be an integer in 2..{cap}")
    return v
