// The OpenTelemetry SDK, wired here only (the code below the composition root uses
// `@opentelemetry/api`): a tracer provider and a meter provider exporting OTLP/HTTP, each when
// the standard OTEL_* variables or the config's `telemetry` section ask for it; otherwise nothing
// is registered, no call is traced (tools/support/trace.ts) and the conventions' series are on
// /metrics only. One of each per process, shared by every app in it (the API's global is set
// once); the last app to close flushes and shuts them down.
import { propagation, trace, type Meter } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPMetricExporter as JsonMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { OTLPMetricExporter as ProtoMetricExporter } from "@opentelemetry/exporter-metrics-otlp-proto";
import { OTLPTraceExporter as JsonExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPTraceExporter as ProtoExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import {
  detectResources,
  envDetector,
  resourceFromAttributes,
  type Resource,
} from "@opentelemetry/resources";
import { MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type Sampler,
  type SpanExporter,
} from "@opentelemetry/sdk-trace-base";
import type { Logger } from "pino";
import { setTracingEnabled } from "../../tools/support/trace.js";
import type { ServerConfig } from "../config/config.js";
import { SERVER_VERSION } from "../version.js";

type Env = Record<string, string | undefined>;
export type TelemetryConfig = ServerConfig["telemetry"];

/** How one signal (traces or metrics) is exported. */
export interface ExportPlan {
  protocol: "http/protobuf" | "http/json";
  /** The signal's URL when the config file names it (the env's endpoints the exporter reads). */
  url?: string;
  serviceName: string;
}

export interface TracesPlan extends ExportPlan {
  sampler: Sampler;
}

export interface MetricsPlan extends ExportPlan {
  /** OTEL_METRIC_EXPORT_INTERVAL, in milliseconds (60 s by default, as the specification says). */
  intervalMs: number;
}

/** What the environment and the config ask of one signal, or why it is not exported. */
function exportPlan(
  signal: "TRACES" | "METRICS",
  env: Env,
  cfg: TelemetryConfig,
): ExportPlan | { off: string } {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true")
    return { off: "OTEL_SDK_DISABLED=true" };
  const exporterVar = `OTEL_${signal}_EXPORTER`;
  const exporter = env[exporterVar]?.trim().toLowerCase();
  if (exporter === "none") return { off: `${exporterVar}=none` };
  if (exporter && exporter !== "otlp")
    throw new Error(
      `${exporterVar}=${exporter} is not supported: use otlp (or none), and set OTEL_EXPORTER_OTLP_ENDPOINT`,
    );
  const fromEnv = env[`OTEL_EXPORTER_OTLP_${signal}_ENDPOINT`] || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (!fromEnv && !cfg.otlp_endpoint && exporter !== "otlp") return { off: "not configured" };
  const protocol = (env[`OTEL_EXPORTER_OTLP_${signal}_PROTOCOL`] ||
    env.OTEL_EXPORTER_OTLP_PROTOCOL ||
    cfg.otlp_protocol ||
    "http/protobuf") as string;
  if (protocol !== "http/protobuf" && protocol !== "http/json")
    throw new Error(
      `OTEL_EXPORTER_OTLP_PROTOCOL=${protocol} is not supported: use http/protobuf or http/json (gRPC is not built in; put a collector in between)`,
    );
  return {
    protocol,
    ...(!fromEnv && cfg.otlp_endpoint
      ? { url: `${cfg.otlp_endpoint.replace(/\/+$/, "")}/v1/${signal.toLowerCase()}` }
      : {}),
    serviceName: env.OTEL_SERVICE_NAME || cfg.service_name || "tpu-mcp",
  };
}

/** What the environment and the config ask for traces, or why nothing is exported. */
export function tracesPlan(env: Env, cfg: TelemetryConfig): TracesPlan | { off: string } {
  const plan = exportPlan("TRACES", env, cfg);
  return "off" in plan ? plan : { ...plan, sampler: samplerFrom(env) };
}

/** What the environment and the config ask for metrics, or why they stay on /metrics only. */
export function metricsPlan(env: Env, cfg: TelemetryConfig): MetricsPlan | { off: string } {
  const plan = exportPlan("METRICS", env, cfg);
  if ("off" in plan) return plan;
  const raw = env.OTEL_METRIC_EXPORT_INTERVAL;
  const intervalMs = raw === undefined || raw === "" ? 60_000 : Number(raw);
  if (!Number.isFinite(intervalMs) || intervalMs < 1)
    throw new Error(`OTEL_METRIC_EXPORT_INTERVAL=${raw} must be a number of milliseconds above 0`);
  return { ...plan, intervalMs };
}

/** OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, as the SDK specification defines them. */
export function samplerFrom(env: Env): Sampler {
  const name = (env.OTEL_TRACES_SAMPLER || "parentbased_always_on").trim().toLowerCase();
  const arg = env.OTEL_TRACES_SAMPLER_ARG;
  const ratio = () => {
    const r = arg === undefined || arg === "" ? 1 : Number(arg);
    if (!Number.isFinite(r) || r < 0 || r > 1)
      throw new Error(`OTEL_TRACES_SAMPLER_ARG=${arg} must be a ratio between 0 and 1`);
    return new TraceIdRatioBasedSampler(r);
  };
  switch (name) {
    case "always_on":
      return new AlwaysOnSampler();
    case "always_off":
      return new AlwaysOffSampler();
    case "traceidratio":
      return ratio();
    case "parentbased_always_on":
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    case "parentbased_always_off":
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case "parentbased_traceidratio":
      return new ParentBasedSampler({ root: ratio() });
    default:
      throw new Error(
        `OTEL_TRACES_SAMPLER=${name} is not supported: use always_on, always_off, traceidratio or parentbased_* of these`,
      );
  }
}

let provider: BasicTracerProvider | undefined;
let meterProvider: MeterProvider | undefined;
let users = 0;

/** The meter the conventions' series are recorded on over OTLP, when metrics are exported. */
export function telemetryMeter(): Meter | undefined {
  return meterProvider?.getMeter("tpu-mcp", SERVER_VERSION);
}

function resourceOf(serviceName: string): Resource {
  return resourceFromAttributes({
    "service.name": serviceName,
    "service.version": SERVER_VERSION,
  }).merge(detectResources({ detectors: [envDetector] }));
}

function startTraces(plan: TracesPlan, env: Env, logger: Logger): BasicTracerProvider {
  const exporterConfig = plan.url ? { url: plan.url } : {};
  const exporter: SpanExporter =
    plan.protocol === "http/json"
      ? new JsonExporter(exporterConfig)
      : new ProtoExporter(exporterConfig);
  const delay = Number(env.OTEL_BSP_SCHEDULE_DELAY);
  const p = new BasicTracerProvider({
    sampler: plan.sampler,
    resource: resourceOf(plan.serviceName),
    spanProcessors: [
      new BatchSpanProcessor(
        exporter,
        Number.isFinite(delay) && delay >= 0 ? { scheduledDelayMillis: delay } : {},
      ),
    ],
  });
  trace.setGlobalTracerProvider(p);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  setTracingEnabled(true);
  logger.info(
    { protocol: plan.protocol, service: plan.serviceName, ...(plan.url ? { url: plan.url } : {}) },
    "exporting OpenTelemetry traces",
  );
  return p;
}

function startMetrics(plan: MetricsPlan, logger: Logger): MeterProvider {
  const exporterConfig = plan.url ? { url: plan.url } : {};
  const exporter =
    plan.protocol === "http/json"
      ? new JsonMetricExporter(exporterConfig)
      : new ProtoMetricExporter(exporterConfig);
  const p = new MeterProvider({
    resource: resourceOf(plan.serviceName),
    readers: [
      new PeriodicExportingMetricReader({
        exporter,
        exportIntervalMillis: plan.intervalMs,
        // The export may not outlast its interval (the SDK's rule), nor its 30 s default.
        exportTimeoutMillis: Math.min(plan.intervalMs, 30_000),
      }),
    ],
  });
  logger.info(
    {
      protocol: plan.protocol,
      service: plan.serviceName,
      interval_ms: plan.intervalMs,
      ...(plan.url ? { url: plan.url } : {}),
    },
    "exporting OpenTelemetry metrics (the conventions' series)",
  );
  return p;
}

/**
 * Starts exporting spans and metrics, each when configured (once per process); returns the app's
 * close hook, which flushes both, and shuts them down when no app is left.
 */
export function startTelemetry(
  cfg: TelemetryConfig,
  logger: Logger,
  env: Env = process.env,
): () => Promise<void> {
  if (!provider && !meterProvider) {
    const traces = tracesPlan(env, cfg);
    const metrics = metricsPlan(env, cfg);
    if ("off" in traces && "off" in metrics) return async () => {};
    if (!("off" in traces)) provider = startTraces(traces, env, logger);
    if (!("off" in metrics)) meterProvider = startMetrics(metrics, logger);
  }
  users++;
  let released = false;
  return async () => {
    if (released) return;
    released = true;
    if (--users > 0) {
      await Promise.all([provider?.forceFlush(), meterProvider?.forceFlush()]);
      return;
    }
    const [p, m] = [provider, meterProvider];
    provider = meterProvider = undefined;
    if (p) {
      setTracingEnabled(false);
      await p.shutdown();
      trace.disable();
      propagation.disable();
    }
    await m?.shutdown();
  };
}
