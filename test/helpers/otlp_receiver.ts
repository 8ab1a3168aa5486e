// A real OTLP/HTTP receiver on loopback for tests: takes the JSON encoding (the server runs with
// OTEL_EXPORTER_OTLP_PROTOCOL=http/json) of POST /v1/traces and /v1/metrics and keeps every span
// and every histogram data point, flattened.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export type AttrValue = string | number | boolean | undefined;

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  /** OTLP SpanKind: 1 internal, 2 server. */
  kind: number;
  /** OTLP status code: 0 unset, 1 ok, 2 error. */
  status: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, AttrValue>;
  events: string[];
  service: AttrValue;
}

function valueOf(v: Record<string, unknown> | undefined): AttrValue {
  if (!v) return undefined;
  if ("stringValue" in v) return v.stringValue as string;
  if ("intValue" in v) return Number(v.intValue);
  if ("doubleValue" in v) return Number(v.doubleValue);
  if ("boolValue" in v) return v.boolValue as boolean;
  return undefined;
}

function attrs(list: unknown): Record<string, AttrValue> {
  const out: Record<string, AttrValue> = {};
  for (const a of (list as Array<{ key: string; value: Record<string, unknown> }>) ?? [])
    out[a.key] = valueOf(a.value);
  return out;
}

/** One histogram data point of one export (cumulative: each export repeats the totals). */
export interface ReceivedPoint {
  metric: string;
  unit: string;
  attributes: Record<string, AttrValue>;
  count: number;
  sum: number;
  service: AttrValue;
}

export interface OtlpReceiver {
  url: string;
  spans: ReceivedSpan[];
  points: ReceivedPoint[];
  /** Payloads that were not OTLP JSON (a test fails on any). */
  rejected: string[];
  close(): Promise<void>;
}

export async function otlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const points: ReceivedPoint[] = [];
  const rejected: string[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      try {
        if (req.url !== "/v1/traces" && req.url !== "/v1/metrics")
          throw new Error(`unexpected path ${req.url}`);
        const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
        for (const rm of body.resourceMetrics ?? []) {
          const service = attrs(rm.resource?.attributes)["service.name"];
          for (const sm of rm.scopeMetrics ?? [])
            for (const m of sm.metrics ?? [])
              for (const p of m.histogram?.dataPoints ?? [])
                points.push({
                  metric: m.name,
                  unit: m.unit,
                  attributes: attrs(p.attributes),
                  count: Number(p.count),
                  sum: Number(p.sum),
                  service,
                });
        }
        for (const rs of body.resourceSpans ?? []) {
          const service = attrs(rs.resource?.attributes)["service.name"];
          for (const ss of rs.scopeSpans ?? [])
            for (const s of ss.spans ?? [])
              spans.push({
                traceId: s.traceId,
                spanId: s.spanId,
                parentSpanId: s.parentSpanId ?? "",
                name: s.name,
                kind: s.kind,
                status: s.status?.code ?? 0,
                startNs: BigInt(s.startTimeUnixNano),
                endNs: BigInt(s.endTimeUnixNano),
                attributes: attrs(s.attributes),
                events: (s.events ?? []).map((e: { name: string }) => e.name),
                service,
              });
        }
        res.writeHead(200, { "content-type": "application/json" }).end("{}");
      } catch (e) {
        rejected.push(String(e));
        res.writeHead(400).end();
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    points,
    rejected,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}
