// Prometheus metrics for /metrics. One registry per app (never the global default) so tests
// and several servers in one process do not collide.
import type { Attributes, Histogram as OtelHistogram, Meter } from "@opentelemetry/api";
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { FleetState, Runtime, WorkerStatus } from "../../runtime/types.js";

export class Metrics {
  readonly registry = new Registry();
  /**
   * `replica`: every series carries it as a label (and every OTLP record as the attribute
   * `tpu_mcp.replica`), so a scrape of several replicas behind one address keeps them apart.
   */
  constructor(private readonly opts: { replica?: string } = {}) {
    if (opts.replica) this.registry.setDefaultLabels({ replica: opts.replica });
  }
  readonly calls = new Counter({
    name: "tpu_mcp_tool_calls_total",
    help: "Tool calls by tool and outcome (ok or an error code).",
    labelNames: ["tool", "outcome"] as const,
    registers: [this.registry],
  });
  readonly latency = new Histogram({
    name: "tpu_mcp_tool_call_seconds",
    help: "Tool call latency in seconds.",
    labelNames: ["tool"] as const,
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
    registers: [this.registry],
  });
  readonly workerRestarts = new Counter({
    name: "tpu_mcp_worker_restarts_total",
    help: "Times the Python worker was restarted after dying or hanging.",
    registers: [this.registry],
  });
  readonly inFlight = new Gauge({
    name: "tpu_mcp_worker_requests_in_flight",
    help: "Requests sent to the worker and not yet answered.",
    registers: [this.registry],
  });
  readonly queueDepth = new Gauge({
    name: "tpu_mcp_model_queue_depth",
    help: "Requests waiting in a loaded model's batcher.",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });
  readonly deviceMemoryFree = new Gauge({
    name: "tpu_mcp_device_memory_free_bytes",
    help: "Free memory of the worker's device, as last reported.",
    labelNames: ["device"] as const,
    registers: [this.registry],
  });
  readonly sessions = new Gauge({
    name: "tpu_mcp_http_sessions",
    help: "Open Streamable HTTP sessions.",
    registers: [this.registry],
  });
  readonly webhookDeliveries = new Counter({
    name: "tpu_mcp_webhook_deliveries_total",
    help: "Approval webhook notifications by final outcome (delivered, or failed after all retries).",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });
  readonly webhookAttemptFailures = new Counter({
    name: "tpu_mcp_webhook_attempt_failures_total",
    help: "Single webhook POST attempts that failed (timeouts, network errors, non-2xx answers).",
    registers: [this.registry],
  });
  readonly alertsFired = new Counter({
    name: "tpu_mcp_alerts_fired_total",
    help: "Alerts fired by rule (policy.alerts) and action (notify or suspend).",
    labelNames: ["rule", "action"] as const,
    registers: [this.registry],
  });
  readonly alertWebhookDeliveries = new Counter({
    name: "tpu_mcp_alert_webhook_deliveries_total",
    help: "Alert webhook notifications by final outcome (delivered, or failed after all retries).",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });
  // The OpenTelemetry semantic conventions' series (MCP and GenAI), named as the OTel → Prometheus
  // mapping writes them (dots to underscores, the unit as a suffix). Labels are bounded: methods,
  // tool and catalog model ids, error codes, protocol versions; never a principal or an argument.
  readonly operationDuration = new Histogram({
    name: "mcp_server_operation_duration_seconds",
    help: "MCP request duration on the server (OTel mcp.server.operation.duration).",
    labelNames: [
      "mcp_method_name",
      "gen_ai_tool_name",
      "error_type",
      "mcp_protocol_version",
    ] as const,
    buckets: [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300],
    registers: [this.registry],
  });
  readonly timeToFirstToken = new Histogram({
    name: "gen_ai_server_time_to_first_token_seconds",
    help: "Time from a generation's submission to its first token, queueing included (OTel gen_ai.server.time_to_first_token).",
    labelNames: ["gen_ai_operation_name", "gen_ai_request_model"] as const,
    buckets: [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10],
    registers: [this.registry],
  });
  readonly timePerOutputToken = new Histogram({
    name: "gen_ai_server_time_per_output_token_seconds",
    help: "Time per output token after the first (OTel gen_ai.server.time_per_output_token).",
    labelNames: ["gen_ai_operation_name", "gen_ai_request_model"] as const,
    buckets: [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5],
    registers: [this.registry],
  });
  readonly tokenUsage = new Histogram({
    name: "gen_ai_client_token_usage",
    help: "Tokens per generation call, by gen_ai_token_type input or output (OTel gen_ai.client.token.usage); _sum counts them all.",
    labelNames: ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type"] as const,
    buckets: [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576],
    registers: [this.registry],
  });
  /** The conventions' series over OTLP as well, once telemetry exports metrics. */
  private otlp?: Record<ConventionSeries, OtelHistogram>;

  /**
   * Records the conventions' series on `meter` too (server/app/telemetry.ts hands it over when
   * OTLP metrics are configured), with the conventions' dotted names, units and attributes.
   */
  exportConventionsTo(meter: Meter): void {
    const h = (name: string, unit: string, description: string) =>
      meter.createHistogram(name, { unit, description });
    this.otlp = {
      operationDuration: h(
        "mcp.server.operation.duration",
        "s",
        "MCP request duration on the server.",
      ),
      timeToFirstToken: h(
        "gen_ai.server.time_to_first_token",
        "s",
        "Time to the first token of a generation, queueing included.",
      ),
      timePerOutputToken: h(
        "gen_ai.server.time_per_output_token",
        "s",
        "Time per output token after the first.",
      ),
      tokenUsage: h(
        "gen_ai.client.token.usage",
        "{token}",
        "Tokens per generation call, by gen_ai.token.type.",
      ),
    };
  }

  /** One observation of a conventions' series, on /metrics and (when exported) over OTLP. */
  observeConvention(series: ConventionSeries, labels: Record<string, string>, value: number): void {
    (this[series] as Histogram<string>).observe(labels, value);
    this.otlp?.[series].record(value, {
      ...otelAttributes(labels),
      ...(this.opts.replica ? { "tpu_mcp.replica": this.opts.replica } : {}),
    });
  }

  readonly consoleSessions = new Gauge({
    name: "tpu_mcp_console_sessions",
    help: "Signed-in operator console sessions.",
    registers: [this.registry],
  });

  /**
   * Per-worker series for a pool, read from the pool when /metrics is scraped: in flight, up,
   * drained (gauges) and calls, failures, restarts (counters, monotonic in the pool).
   */
  /** The streaming audit sink's counts (policy.audit.sink), read at each scrape. */
  observeAuditSink(status: () => { sent: number; dropped: number; queued: number }): void {
    const gauge = (name: string, help: string, value: () => number) =>
      new Gauge({
        name,
        help,
        registers: [this.registry],
        collect() {
          this.set(value());
        },
      });
    gauge(
      "tpu_mcp_audit_sink_sent_records",
      "Audit records the sink has delivered.",
      () => status().sent,
    );
    gauge(
      "tpu_mcp_audit_sink_dropped_records",
      "Audit records the sink dropped because its queue was full (each gap is also a line in the stream).",
      () => status().dropped,
    );
    gauge(
      "tpu_mcp_audit_sink_queued_records",
      "Audit records waiting in the sink's queue.",
      () => status().queued,
    );
  }

  observeWorkers(runtime: Runtime, fleet?: () => FleetRow): void {
    // The default pool of one worker publishes no per-worker series.
    if (runtime.single) return;
    const workers = () => runtime.workers();
    const labelNames = ["worker", "device"] as const;
    const gauge = (name: string, help: string, value: (w: WorkerRow) => number) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers: [this.registry],
        collect() {
          this.reset();
          for (const w of workers()) this.set({ worker: w.name, device: w.device }, value(w));
        },
      });
    const counter = (name: string, help: string, value: (w: WorkerRow) => number) =>
      new Counter({
        name,
        help,
        labelNames,
        registers: [this.registry],
        collect() {
          this.reset();
          for (const w of workers()) this.inc({ worker: w.name, device: w.device }, value(w));
        },
      });
    gauge(
      "tpu_mcp_pool_worker_in_flight",
      "Calls in flight on each worker of the pool.",
      (w) => w.in_flight,
    );
    gauge("tpu_mcp_pool_worker_up", "1 when the worker is ready, else 0.", (w) =>
      w.state === "ready" ? 1 : 0,
    );
    gauge("tpu_mcp_pool_worker_drained", "1 when the worker is drained.", (w) =>
      w.draining ? 1 : 0,
    );
    gauge("tpu_mcp_pool_worker_models", "Models loaded on each worker.", (w) => w.models.length);
    counter(
      "tpu_mcp_pool_worker_calls_total",
      "Calls the pool sent to each worker.",
      (w) => w.calls,
    );
    counter(
      "tpu_mcp_pool_worker_failures_total",
      "Calls that failed on each worker (any error).",
      (w) => w.failures,
    );
    counter(
      "tpu_mcp_pool_worker_restarts_total",
      "Restarts (local) or reconnects (remote) of each worker.",
      (w) => w.restarts,
    );
    if (fleet) this.observeFleet(fleet);
  }

  /** A Ray fleet (runtime.ray): target vs observed actors, restarts; absent without one. */
  observeFleet(fleet: () => FleetRow): void {
    const gauge = (name: string, help: string, value: (f: FleetRow) => number | null) =>
      new Gauge({
        name,
        help,
        // Labelled by the cluster, so an unknown value (null) is absent rather than a 0.
        labelNames: ["cluster"] as const,
        registers: [this.registry],
        collect() {
          this.reset();
          const f = fleet();
          const v = value(f);
          if (v !== null) this.set({ cluster: f.address }, v);
        },
      });
    gauge("tpu_mcp_fleet_target_actors", "Ray fleet: actors wanted.", (f) => f.target);
    gauge(
      "tpu_mcp_fleet_observed_actors",
      "Ray fleet: actors placed and serving.",
      (f) => f.observed,
    );
    gauge(
      "tpu_mcp_fleet_capacity_actors",
      "Ray fleet: slots the cluster offers (absent: no limit known).",
      (f) => f.capacity,
    );
    gauge("tpu_mcp_fleet_driver_up", "Ray fleet: 1 when the driver is ready, else 0.", (f) =>
      f.state === "ready" ? 1 : 0,
    );
    gauge(
      "tpu_mcp_fleet_driver_restarts",
      "Ray fleet: restarts of the driver process.",
      (f) => f.driver_restarts,
    );
    gauge(
      "tpu_mcp_fleet_actor_restarts",
      "Ray fleet: Ray's restarts of the actors placed now.",
      (f) => f.actor_restarts,
    );
  }
}

type ConventionSeries =
  "operationDuration" | "timeToFirstToken" | "timePerOutputToken" | "tokenUsage";

/** The Prometheus label names of the conventions' series, as the OTel attribute keys they map. */
const ATTRIBUTE_OF: Record<string, string> = {
  mcp_method_name: "mcp.method.name",
  gen_ai_tool_name: "gen_ai.tool.name",
  error_type: "error.type",
  mcp_protocol_version: "mcp.protocol.version",
  gen_ai_operation_name: "gen_ai.operation.name",
  gen_ai_request_model: "gen_ai.request.model",
  gen_ai_token_type: "gen_ai.token.type",
};

/** OTel attributes of a label set; an empty label (no error) is left out, as OTel has no "". */
function otelAttributes(labels: Record<string, string>): Attributes {
  const out: Attributes = {};
  for (const [k, v] of Object.entries(labels)) if (v !== "") out[ATTRIBUTE_OF[k] ?? k] = v;
  return out;
}

type FleetRow = FleetState;

type WorkerRow = WorkerStatus;

interface GenerationFigures {
  model?: unknown;
  ttft_ms?: unknown;
  tokens_per_s?: unknown;
  new_tokens?: unknown;
  generations?: Array<{ usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } }>;
}

/**
 * A generation's figures from run_inference's structured result (absent for a forward): TTFT as
 * the worker measured it, time per output token as (total − TTFT) ÷ (steps − 1), tokens in/out.
 */
export function observeGeneration(m: Metrics, operation: string, out: unknown): void {
  const o = (out ?? {}) as GenerationFigures;
  if (typeof o.model !== "string" || !Array.isArray(o.generations)) return;
  const labels = { gen_ai_operation_name: operation, gen_ai_request_model: o.model };
  let input = 0;
  let output = 0;
  for (const g of o.generations) {
    if (typeof g.usage?.prompt_tokens === "number") input += g.usage.prompt_tokens;
    if (typeof g.usage?.completion_tokens === "number") output += g.usage.completion_tokens;
  }
  m.observeConvention("tokenUsage", { ...labels, gen_ai_token_type: "input" }, input);
  m.observeConvention("tokenUsage", { ...labels, gen_ai_token_type: "output" }, output);
  if (typeof o.ttft_ms !== "number") return;
  const ttft = o.ttft_ms / 1000;
  m.observeConvention("timeToFirstToken", labels, ttft);
  const steps = Array.isArray(o.new_tokens) ? Math.max(0, ...(o.new_tokens as number[])) : 0;
  // tokens_per_s is all sequences' tokens over the request's time from submission.
  if (steps > 1 && typeof o.tokens_per_s === "number" && o.tokens_per_s > 0) {
    const total = output / o.tokens_per_s;
    if (total > ttft)
      m.observeConvention("timePerOutputToken", labels, (total - ttft) / (steps - 1));
  }
}
