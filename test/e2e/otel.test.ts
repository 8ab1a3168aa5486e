// OpenTelemetry traces (docs/observability.md): the real server, exporting OTLP/HTTP to a real
// receiver on loopback, a real worker, real SDK clients of both protocol eras. Each call is one
// SERVER span by the MCP conventions, its parent the caller's `_meta.traceparent`; the gate's
// waits, the worker call and the worker's own stages are its descendants; refusals carry their
// code; the audit record names the trace.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { auditRows } from "../helpers/audit_rows.js";
import { scaled } from "../helpers/calibrate.js";
import { callModern, connectModernHttp } from "../helpers/modern.js";
import { otlpReceiver, type OtlpReceiver, type ReceivedSpan } from "../helpers/otlp_receiver.js";
import {
  connectHttp,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";

const args = {
  model: "mnist-cnn",
  tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(0.5) }],
};

function caller() {
  const traceId = randomBytes(16).toString("hex");
  const spanId = randomBytes(8).toString("hex");
  return { traceId, spanId, traceparent: `00-${traceId}-${spanId}-01` };
}

describe("OpenTelemetry traces", () => {
  let receiver: OtlpReceiver;
  let server: HttpServerProc;
  let legacy: Awaited<ReturnType<typeof connectHttp>>;
  let modern: Awaited<ReturnType<typeof connectModernHttp>>;
  let dataDir: string;

  beforeAll(async () => {
    receiver = await otlpReceiver();
    const config = writeConfig({
      policy: {
        approvals: { rules: [{ tool: "run_benchmark" }], elicitation: false },
        limits: { rate_limit: { per_principal_per_minute: 6000 } },
      },
    });
    dataDir = join(config, "..", "data");
    server = await startHttpServer(config, [], {
      env: {
        ...process.env,
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
        OTEL_SERVICE_NAME: "tpu-mcp-test",
        OTEL_BSP_SCHEDULE_DELAY: "50",
        OTEL_METRIC_EXPORT_INTERVAL: "200",
      },
    });
    legacy = await connectHttp(server.url, server.token);
    modern = await connectModernHttp(server.url, server.token);
    const loaded = await legacy.client.callTool({
      name: "load_model",
      arguments: { model: "mnist-cnn" },
    });
    expect(loaded.isError).toBeFalsy();
  }, scaled(180_000));

  afterAll(async () => {
    await Promise.allSettled([legacy?.close(), modern?.close()]);
    await server?.stop();
    await receiver?.close();
  });

  /** The spans of one trace, once `ready` holds for them (the exporter sends in batches). */
  async function traceOf(
    traceId: string,
    ready: (spans: ReceivedSpan[]) => boolean,
  ): Promise<ReceivedSpan[]> {
    return vi.waitFor(
      () => {
        const spans = receiver.spans.filter((s) => s.traceId === traceId);
        if (!ready(spans)) throw new Error(`trace ${traceId}: ${spans.map((s) => s.name)}`);
        return spans;
      },
      { timeout: scaled(30_000), interval: 50 },
    );
  }
  const named = (spans: ReceivedSpan[], name: string) => spans.find((s) => s.name === name);
  const childrenOf = (spans: ReceivedSpan[], parent: ReceivedSpan) =>
    spans.filter((s) => s.parentSpanId === parent.spanId);

  it("a 2025-11-25 session: the SERVER span continues the caller's trace, down into the worker", async () => {
    const c = caller();
    const r = await legacy.client.callTool({
      name: "run_inference",
      arguments: args,
      _meta: { traceparent: c.traceparent },
    });
    expect(r.isError).toBeFalsy();
    const spans = await traceOf(c.traceId, (s) => !!named(s, "worker.forward"));
    const root = named(spans, "tools/call run_inference")!;
    expect(root.kind).toBe(2); // SERVER
    expect(root.parentSpanId).toBe(c.spanId);
    expect(root.service).toBe("tpu-mcp-test");
    expect(root.attributes).toMatchObject({
      "mcp.method.name": "tools/call",
      "gen_ai.tool.name": "run_inference",
      "gen_ai.operation.name": "execute_tool",
      "mcp.protocol.version": "2025-11-25",
      "network.transport": "tcp",
    });
    // A digest of the session id, never the id (it is the session's bearer on HTTP).
    expect(root.attributes["mcp.session.id"]).toMatch(/^[0-9a-f]{32}$/);
    expect(root.attributes["error.type"]).toBeUndefined();
    expect(root.status).not.toBe(2);

    // The gate's waiting steps, then the worker call, each a child of the SERVER span.
    const children = childrenOf(spans, root).map((s) => s.name);
    for (const step of ["gate.rate", "gate.estimate", "gate.approval", "gate.budget", "gate.slot"])
      expect(children).toContain(step);
    const worker = childrenOf(spans, root).find((s) => s.name.startsWith("worker "))!;
    expect(worker).toBeDefined();
    // The worker's own stages, measured in the worker, under the worker-call span and inside it.
    const inWorker = childrenOf(spans, worker);
    for (const stage of ["worker.request", "worker.queue", "worker.forward"]) {
      const s = named(inWorker, stage);
      expect(s, stage).toBeDefined();
      expect(s!.startNs >= worker.startNs && s!.endNs <= worker.endNs).toBe(true);
    }
    expect(named(inWorker, "worker.forward")!.attributes["tpu_mcp.batched_with"]).toBe(1);
    // The stage stamps are events on the SERVER span: one mechanism for the bench and for spans.
    expect(root.events).toEqual(expect.arrayContaining(["d.parsed", "g.audit_allowed"]));

    // The audit records of the call name its trace and SERVER span.
    const records = auditRows(dataDir).filter((x) => x.trace_id === c.traceId);
    expect(records.map((x) => x.outcome)).toEqual(["allowed", "executed"]);
    expect(records.every((x) => x.span_id === root.spanId)).toBe(true);
  });

  it("a 2026-07-28 stateless request: same span, its protocol version, no session", async () => {
    const c = caller();
    const r = await modern.client.callTool(
      { name: "run_inference", arguments: args, _meta: { traceparent: c.traceparent } },
      { timeout: scaled(300_000) } as any,
    );
    expect(r.isError).toBeFalsy();
    const spans = await traceOf(c.traceId, (s) => !!named(s, "worker.forward"));
    const root = named(spans, "tools/call run_inference")!;
    expect(root.parentSpanId).toBe(c.spanId);
    expect(root.attributes["mcp.protocol.version"]).toBe("2026-07-28");
    expect(root.attributes["mcp.session.id"]).toBeUndefined();
    expect(childrenOf(spans, root).map((s) => s.name)).toContain("gate.slot");
  });

  it("a call without traceparent starts its own trace", async () => {
    const before = receiver.spans.length;
    const r = await callModern(modern.client, "get_runtime_status", {});
    expect(r.isError).toBeFalsy();
    const root = await vi.waitFor(
      () => {
        const s = receiver.spans
          .slice(before)
          .find((x) => x.name === "tools/call get_runtime_status");
        if (!s) throw new Error("no span yet");
        return s;
      },
      { timeout: scaled(30_000), interval: 50 },
    );
    expect(root.parentSpanId).toBe("");
    expect(root.traceId).toMatch(/^[0-9a-f]{32}$/);
    const rec = auditRows(dataDir).find((x) => x.span_id === root.spanId);
    expect(rec?.trace_id).toBe(root.traceId);
  });

  it("refused calls: the span fails with tool_error and the code; the gate step that refused fails too", async () => {
    const bad = caller();
    const r = await legacy.client.callTool({
      name: "run_inference",
      arguments: { model: "mnist-cnn", tensors: "not tensors" },
      _meta: { traceparent: bad.traceparent },
    });
    expect(errorOf(r)?.code).toBe("invalid_argument");
    const [root] = await traceOf(bad.traceId, (s) => s.some((x) => x.kind === 2));
    expect(root.status).toBe(2);
    expect(root.attributes["error.type"]).toBe("tool_error");
    expect(root.attributes["tpu_mcp.error.code"]).toBe("invalid_argument");
    const denied = auditRows(dataDir).find((x) => x.trace_id === bad.traceId);
    expect(denied).toMatchObject({ outcome: "denied", code: "invalid_argument" });

    const ask = caller();
    const b = await legacy.client.callTool({
      name: "run_benchmark",
      arguments: { model: "mnist-cnn" },
      _meta: { traceparent: ask.traceparent },
    });
    expect(errorOf(b)?.code).toBe("approval_required");
    const spans = await traceOf(ask.traceId, (s) => !!named(s, "gate.approval"));
    const approval = named(spans, "gate.approval")!;
    expect(approval.status).toBe(2);
    expect(approval.attributes["error.type"]).toBe("approval_required");
    expect(named(spans, "tools/call run_benchmark")!.attributes["tpu_mcp.error.code"]).toBe(
      "approval_required",
    );
    expect(auditRows(dataDir).find((x) => x.trace_id === ask.traceId)?.outcome).toBe(
      "approval_requested",
    );
    expect(receiver.rejected).toEqual([]);
  });

  it("tools/list and resources/* get their SERVER span too; a failed read carries its JSON-RPC code", async () => {
    const c = caller();
    await legacy.client.listTools({ _meta: { traceparent: c.traceparent } });
    await legacy.client.listResources({ _meta: { traceparent: c.traceparent } });
    const missing = await legacy.client
      .readResource({ uri: "tpu://benchmarks/none", _meta: { traceparent: c.traceparent } })
      .then(
        () => undefined,
        (e: { code?: number }) => e.code,
      );
    expect(typeof missing).toBe("number");
    const spans = await traceOf(c.traceId, (s) => s.length >= 3);
    for (const name of ["tools/list", "resources/list", "resources/read"]) {
      const span = named(spans, name)!;
      expect(span, name).toBeDefined();
      expect(span.kind).toBe(2);
      expect(span.parentSpanId).toBe(c.spanId);
      expect(span.attributes).toMatchObject({
        "mcp.method.name": name,
        "mcp.protocol.version": "2025-11-25",
      });
    }
    const read = named(spans, "resources/read")!;
    expect(read.status).toBe(2);
    // The code the server answered (the 2025 era's "resource not found").
    expect(read.attributes).toMatchObject({
      "error.type": "-32002",
      "rpc.response.status_code": "-32002",
    });
    expect(named(spans, "tools/list")!.status).toBe(0);
  });

  it("a generation: prefill and decode spans from the worker, the conventions' metrics on /metrics", async () => {
    const load = await legacy.client.callTool({
      name: "load_model",
      arguments: { model: "tiny-gpt2" },
    });
    expect(load.isError).toBeFalsy();
    const c = caller();
    const r = await legacy.client.callTool({
      name: "run_inference",
      arguments: { model: "tiny-gpt2", texts: ["hello"], max_new_tokens: 8 },
      _meta: { traceparent: c.traceparent },
    });
    expect(r.isError).toBeFalsy();
    const spans = await traceOf(c.traceId, (s) => !!named(s, "worker.decode"));
    const prefill = named(spans, "worker.prefill")!;
    const decode = named(spans, "worker.decode")!;
    expect(prefill.endNs <= decode.startNs).toBe(true);
    // Where the time to first token went: waiting behind other joiners' forwards, then its own.
    const wait = named(spans, "worker.prefill.wait")!;
    const own = named(spans, "worker.prefill.forward")!;
    expect(wait.attributes["tpu_mcp.forwards_ahead"]).toBe(0);
    expect(own.attributes["tpu_mcp.shape"]).toMatch(/^prefill \d+x\d+$/);
    // In order within the prefill span, up to the jitter of converting the worker's monotonic
    // stamps to wall time (each conversion reads two clocks): 1 ms.
    const jitter = 1_000_000n;
    expect(prefill.startNs <= wait.startNs + jitter && wait.endNs <= own.startNs + jitter).toBe(
      true,
    );
    expect(own.endNs <= prefill.endNs + jitter).toBe(true);
    expect(decode.attributes["tpu_mcp.new_tokens"]).toBe(
      (r.structuredContent as { new_tokens: number[] }).new_tokens[0],
    );

    const text = await (await fetch(new URL("/metrics", server.url))).text();
    const series = (name: string) => text.split("\n").filter((l) => l.startsWith(name));
    const labels = 'gen_ai_operation_name="text_completion",gen_ai_request_model="tiny-gpt2"';
    expect(series("gen_ai_server_time_to_first_token_seconds_count")).toContain(
      `gen_ai_server_time_to_first_token_seconds_count{${labels}} 1`,
    );
    expect(series("gen_ai_server_time_per_output_token_seconds_count")).toContain(
      `gen_ai_server_time_per_output_token_seconds_count{${labels}} 1`,
    );
    const out = (r.structuredContent as { new_tokens: number[] }).new_tokens[0];
    expect(series("gen_ai_client_token_usage_sum")).toContain(
      `gen_ai_client_token_usage_sum{${labels},gen_ai_token_type="output"} ${out}`,
    );
    expect(
      series("mcp_server_operation_duration_seconds_count").some((l) =>
        l.includes(
          'gen_ai_tool_name="run_inference",error_type="",mcp_protocol_version="2026-07-28"',
        ),
      ),
    ).toBe(true);
    expect(
      series("mcp_server_operation_duration_seconds_count").some((l) =>
        l.includes('gen_ai_tool_name="run_benchmark",error_type="tool_error"'),
      ),
    ).toBe(true);
    // Bounded labels: no principal, no argument value.
    expect(text).not.toMatch(/principal|hello/);

    // The same series over OTLP, named and attributed by the conventions (cumulative: the
    // newest export's point holds every observation so far).
    const point = (metric: string, attrs: Record<string, unknown>) =>
      vi.waitFor(
        () => {
          const p = receiver.points
            .filter(
              (q) =>
                q.metric === metric &&
                Object.entries(attrs).every(([k, v]) => q.attributes[k] === v),
            )
            .at(-1);
          if (!p) throw new Error(`no ${metric} point ${JSON.stringify(attrs)} exported yet`);
          return p;
        },
        { timeout: scaled(30_000), interval: 50 },
      );
    const gen = { "gen_ai.operation.name": "text_completion", "gen_ai.request.model": "tiny-gpt2" };
    const ttft = await point("gen_ai.server.time_to_first_token", gen);
    expect(ttft).toMatchObject({ unit: "s", count: 1, service: "tpu-mcp-test" });
    expect(ttft.sum).toBeCloseTo((r.structuredContent as { ttft_ms: number }).ttft_ms / 1000, 6);
    expect(await point("gen_ai.server.time_per_output_token", gen)).toMatchObject({ count: 1 });
    expect(
      await point("gen_ai.client.token.usage", { ...gen, "gen_ai.token.type": "output" }),
    ).toMatchObject({ unit: "{token}", sum: out });
    const op = await point("mcp.server.operation.duration", {
      "mcp.method.name": "tools/call",
      "gen_ai.tool.name": "run_inference",
      "mcp.protocol.version": "2026-07-28",
    });
    expect(op.unit).toBe("s");
    expect(op.attributes).not.toHaveProperty("error.type");
    await point("mcp.server.operation.duration", {
      "gen_ai.tool.name": "run_benchmark",
      "error.type": "tool_error",
    });
    for (const p of receiver.points)
      expect(Object.keys(p.attributes).join(" ")).not.toMatch(/principal/);
  });
});
