"""Work "generate": the benchmark's prompts decoded by the decode loop that serves callers
(generation/loop.py), each prompt submitted as a request of its own, as run_inference submits
one, so admission, joins and the step are what is timed."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from ..adapters.base import Prepared
from ..generation.loop import DecodeLoop
from ..generation.params import GenParams, GenRequest
from ..shapes import ShapeCounter


@contextlib.contextmanager
def serving_loop(worker, entry, lease) -> Iterator[DecodeLoop]:
    """The loaded model's own decode loop when the benchmark runs on its adapter (its callers'
    requests share the steps); else a loop built as loading builds one, over the run's copy,
    closed when the block ends."""
    if not lease.temporary:
        served = worker.served.get(entry.id)
        loop = getattr(served, "batcher", None)
        if isinstance(loop, DecodeLoop) and loop.adapter is lease.adapter:
            yield loop
            return
    loop = DecodeLoop(f"{entry.id}:benchmark", lease.adapter, max_batch=entry.batching.max_batch)
    try:
        yield loop
    finally:
        loop.close("the benchmark ended")


class LoopDecode:
    """One timed call: every prompt submitted to `loop`, then every answer awaited."""

    def __init__(self, loop: DecodeLoop, prompts: list[list[int]], max_new: int, sampling: GenParams | None, token):
        params = dataclasses.replace(sampling, max_new_tokens=max_new) if sampling else GenParams(max_new)
        # No prefix partition: every call prefills its prompts in full, as a prompt's first call does.
        self.requests = [Prepared(("generate",), 1, GenRequest([p], params, None)) for p in prompts]
        self.loop = loop
        self.token = token

    def __call__(self) -> list[int]:
        """The new tokens' count per prompt, as the loop answered them (a cancel answers the
        tokens each had)."""
        futures = [self.loop.submit(r, self.token) for r in self.requests]
        return [n for f in futures for n in f.result().result["new_tokens"]]


def loop_counts(loop: DecodeLoop) -> dict[str, int]:
    st = loop.stats
    return {"requests": st.requests, "prefills": st.prefills, "steps": st.steps, "joins": st.joins, "tokens": st.tokens}


def shapes_since(counter: ShapeCounter, before: ShapeCounter) -> ShapeCounter:
    """The forwards `counter` recorded after `before` was copied from it."""
    out = ShapeCounter()
    for key, n in counter.seen.items():
        if n > before.seen.get(key, 0):
            out.seen[key] = n - before.seen.get(key, 0)
    out.real_tokens = counter.real_tokens - before.real_tokens
    out.padded_tokens = counter.padded_tokens - before.padded_tokens
    return out


def snapshot(counter: ShapeCounter) -> ShapeCounter:
    copy = ShapeCounter()
    with counter._lock:
        copy.seen = dict(counter.seen)
        copy.real_tokens, copy.padded_tokens = counter.real_tokens, counter.padded_tokens
    return copy
