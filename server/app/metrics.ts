// Prometheus metrics for /metrics. One registry per app (never the global default) so tests
// and several servers in one process do not collide.
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { FleetState, Runtime, WorkerStatus } from "../../runtime/types.js";

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

type FleetRow = FleetState;

type WorkerRow = WorkerStatus;
