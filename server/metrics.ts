// Prometheus metrics for /metrics. One registry per app (never the global default) so tests
// and several servers in one process do not collide.
import { Counter, Gauge, Histogram, Registry } from "prom-client";

export class Metrics {
  readonly registry = new Registry();
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
  readonly consoleSessions = new Gauge({
    name: "tpu_mcp_console_sessions",
    help: "Signed-in operator console sessions.",
    registers: [this.registry],
  });
}
