// The worker's part of a call's trace, from the `trace` list of its reply header: a two-item
// entry [stage, µs] is a stamp (the bench reads it), a three-item entry [name, start µs, end µs]
// (or four, with attributes) is a span the worker measured (queueing, prefill, decode, forward,
// compile, device synchronize), re-emitted here as a child of the worker-call span. The worker
// exports nothing itself, so a remote or Ray worker needs no route to the collector.
import type { CallTrace, SpanAttributes, TraceSpan } from "../types.js";

export interface PendingTrace {
  /** The request's trace (stamps). */
  call: CallTrace;
  /** The worker-call span, parent of the worker's own spans. */
  span: TraceSpan;
}

const MAX_ENTRIES = 256;

function attrsOf(v: unknown): SpanAttributes | undefined {
  if (!v || typeof v !== "object" || Array.isArray(v)) return undefined;
  const out: SpanAttributes = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>).slice(0, 16))
    if (typeof x === "string" || typeof x === "number" || typeof x === "boolean")
      out[`tpu_mcp.${k}`] = typeof x === "string" ? x.slice(0, 200) : x;
  return out;
}

export function recordWorkerTrace(t: PendingTrace, entries: unknown): void {
  if (!Array.isArray(entries)) return;
  for (const e of entries.slice(0, MAX_ENTRIES)) {
    if (!Array.isArray(e) || typeof e[0] !== "string" || typeof e[1] !== "number") continue;
    if (typeof e[2] === "number") {
      t.span.child(`worker.${e[0].slice(0, 60)}`, attrsOf(e[3]), e[1]).end(undefined, e[2]);
    } else {
      t.call.mark(e[0], e[1]);
    }
  }
}
