"""Spans of a traced request, recorded into its `trace` list (protocol.Request.trace) beside the
stage stamps: an entry [name, start µs, end µs, attributes] is a span, [stage, µs] a stamp. The
reply header carries the list back; the server re-emits the spans as children of its worker-call
span (runtime/client/worker_trace.ts), so a worker on another host exports nothing itself."""

from __future__ import annotations

from typing import Any

from .protocol import now_us


def stamp(trace: list | None, stage: str, at_us: int | None = None) -> None:
    if trace is not None:
        trace.append([stage, now_us() if at_us is None else at_us])


def span_since(trace: list | None, name: str, since: str, **attrs: Any) -> None:
    """A span from the latest stamp `since` until now (nothing when that stamp is missing)."""
    if trace is None:
        return
    start = next((e[1] for e in reversed(trace) if len(e) == 2 and e[0] == since), None)
    if start is not None:
        span(trace, name, start, now_us(), **attrs)


def span(trace: list | None, name: str, start_us: int, end_us: int, **attrs: Any) -> None:
    if trace is not None:
        trace.append([name, start_us, end_us, attrs] if attrs else [name, start_us, end_us])
