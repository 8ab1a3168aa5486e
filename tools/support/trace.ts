// The one per-call trace: an OpenTelemetry SERVER span per MCP request (docs/observability.md),
// its child spans (gate waits, the worker call, the worker's own stages) and the stage stamps the
// bench's decomposition reads (bench/decompose.ts). Only `@opentelemetry/api` here: the SDK and
// exporters are wired at the composition root (server/app/telemetry.ts), which calls
// `setTracingEnabled`. A call is traced when spans are exported, or when the server config sets
// `trace_calls: true` and the request carries `_meta["tpu-mcp/trace"]` (the bench); otherwise
// `tracerFor` answers undefined and no layer pays more than an `undefined` check.
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context as otelContext,
  propagation,
  trace as otelTrace,
  type Attributes,
  type Context,
  type Span,
  type TextMapGetter,
} from "@opentelemetry/api";
import { monotonicUs } from "../../runtime/monotonic.js";
import type { CallTrace, TraceSpan } from "../../runtime/types.js";

// The transport and the bench read the same clock through here.
export { monotonicUs };

export const TRACE_META_KEY = "tpu-mcp/trace";
const TRACER_NAME = "tpu-mcp";

let exporting = false;
/** Set once by the composition root when a tracer provider exports spans. */
export function setTracingEnabled(on: boolean): void {
  exporting = on;
}
export function tracingEnabled(): boolean {
  return exporting;
}

/** Epoch ms of a CLOCK_MONOTONIC µs stamp (OTel times are wall-clock). */
function wallMs(atUs: number): number {
  return performance.timeOrigin + performance.now() - (monotonicUs() - atUs) / 1000;
}

const metaGetter: TextMapGetter<Record<string, unknown>> = {
  keys: (carrier) => Object.keys(carrier),
  get: (carrier, key) => {
    const v = carrier[key];
    return typeof v === "string" ? v : undefined;
  },
};

/** The caller's context from `_meta.traceparent` / `tracestate` (SEP-414), or the root. */
export function callerContext(meta: unknown): Context {
  if (!meta || typeof meta !== "object") return ROOT_CONTEXT;
  return propagation.extract(ROOT_CONTEXT, meta as Record<string, unknown>, metaGetter);
}

/** W3C traceparent of a span (for the worker's frame header). */
function traceparentOf(span: Span): string | undefined {
  const sc = span.spanContext();
  if (!otelTrace.isSpanContextValid(sc)) return undefined;
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 1).toString(16).padStart(2, "0")}`;
}

class OtelSpan implements TraceSpan {
  constructor(readonly span: Span) {}
  child(name: string, attrs?: Attributes, startUs?: number): TraceSpan {
    const parent = otelTrace.setSpan(ROOT_CONTEXT, this.span);
    return new OtelSpan(
      otelTrace
        .getTracer(TRACER_NAME)
        .startSpan(
          name,
          { kind: SpanKind.INTERNAL, attributes: attrs, startTime: startUs && wallMs(startUs) },
          parent,
        ),
    );
  }
  set(attrs: Attributes): void {
    this.span.setAttributes(attrs);
  }
  end(errorType?: string, endUs?: number): void {
    if (errorType) {
      this.span.setAttribute("error.type", errorType);
      this.span.setStatus({ code: SpanStatusCode.ERROR });
    }
    this.span.end(endUs && wallMs(endUs));
  }
  traceparent(): string | undefined {
    return traceparentOf(this.span);
  }
  ids(): { trace_id: string; span_id: string } | undefined {
    const sc = this.span.spanContext();
    return otelTrace.isSpanContextValid(sc)
      ? { trace_id: sc.traceId, span_id: sc.spanId }
      : undefined;
  }
}

/**
 * One request's trace: its SERVER span and the stamps the bench reads. `mark` adds a stage as
 * a span event and, for the bench, to `marks` (returned in the result's meta).
 */
export class CallTracer extends OtelSpan implements CallTrace {
  readonly marks: Array<[string, number]> = [];
  constructor(
    span: Span,
    private readonly keepMarks: boolean,
  ) {
    super(span);
  }
  mark(stage: string, atUs: number = monotonicUs()): void {
    if (this.keepMarks) this.marks.push([stage, atUs]);
    if (this.span.isRecording()) this.span.addEvent(stage, wallMs(atUs));
  }
  /** Runs `fn` with this span active (for code that reads the active context). */
  with<T>(fn: () => T): T {
    return otelContext.with(otelTrace.setSpan(otelContext.active(), this.span), fn);
  }
  get benchAsked(): boolean {
    return this.keepMarks;
  }
}

export interface RequestSpan {
  /** `mcp.method.name`, e.g. tools/call. */
  method: string;
  /** The low-cardinality target of the span name (the tool's name). */
  target?: string;
  attributes: Attributes;
  /** The request's `_meta` (traceparent, tracestate, the bench's ask). */
  meta: unknown;
}

/**
 * The tracer for a request, or undefined when neither spans are exported nor the bench asked
 * (`benchEnabled`: the config's trace_calls). Stamps the transport left in the request's meta
 * (`recv_us`, `parsed_us`) come first.
 */
export function tracerFor(benchEnabled: boolean, req: RequestSpan): CallTracer | undefined {
  const meta =
    req.meta && typeof req.meta === "object" ? (req.meta as Record<string, unknown>) : undefined;
  const asked = benchEnabled ? meta?.[TRACE_META_KEY] : undefined;
  const bench = !!asked && typeof asked === "object";
  if (!exporting && !bench) return undefined;
  const a = (bench ? asked : {}) as Record<string, unknown>;
  const startUs = typeof a.recv_us === "number" ? a.recv_us : undefined;
  const span = otelTrace
    .getTracer(TRACER_NAME)
    .startSpan(
      req.target ? `${req.method} ${req.target}` : req.method,
      { kind: SpanKind.SERVER, attributes: req.attributes, startTime: startUs && wallMs(startUs) },
      callerContext(meta),
    );
  const t = new CallTracer(span, bench);
  if (startUs !== undefined) t.mark("s.recv", startUs);
  if (typeof a.parsed_us === "number") t.mark("s.parsed", a.parsed_us);
  t.mark("s.handler");
  return t;
}
