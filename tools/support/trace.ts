// Per-call timestamps for the bench's decomposition of a tool call (bench/decompose.ts).
// Off unless the server config sets `trace_calls: true` AND the request carries
// `_meta["tpu-mcp/trace"]`; then every layer the call crosses stamps it (transport, dispatch,
// gate stages, handler, runtime client, the worker's threads) and the stamps come back in the
// result's `_meta["tpu-mcp/trace"]`. When off, no layer pays more than an `undefined` check.
import { monotonicUs } from "../../runtime/monotonic.js";
import type { CallTrace } from "../../runtime/types.js";

// The transport and the bench read the same clock through here.
export { monotonicUs };

export const TRACE_META_KEY = "tpu-mcp/trace";

export class CallTracer implements CallTrace {
  readonly marks: Array<[string, number]> = [];
  mark(stage: string, atUs: number = monotonicUs()): void {
    this.marks.push([stage, atUs]);
  }
}

/**
 * The tracer for a request, or undefined when tracing is off or the caller did not ask.
 * Stamps the transport left in the request's meta (`recv_us`, `parsed_us`) come first.
 */
export function tracerFor(enabled: boolean, meta: unknown): CallTracer | undefined {
  if (!enabled || !meta || typeof meta !== "object") return undefined;
  const asked = (meta as Record<string, unknown>)[TRACE_META_KEY];
  if (!asked || typeof asked !== "object") return undefined;
  const t = new CallTracer();
  const a = asked as Record<string, unknown>;
  if (typeof a.recv_us === "number") t.mark("s.recv", a.recv_us);
  if (typeof a.parsed_us === "number") t.mark("s.parsed", a.parsed_us);
  t.mark("s.handler");
  return t;
}
