// The OpenTelemetry SDK, wired here only (the code below the composition root uses
// `@opentelemetry/api`): a tracer provider exporting OTLP/HTTP, when the standard OTEL_*
// variables or the config's `telemetry` section ask for it; otherwise nothing is registered and
// no call is traced (tools/support/trace.ts). One provider per process, shared by every app in
// it (the API's global is set once); the last app to close flushes and shuts it down.
import { propagation, trace } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter as JsonExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPTraceExporter as ProtoExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { detectResources, envDetector, resourceFromAttributes } from "@opentelemetry/resources";
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

export interface TracesPlan {
  protocol: "http/protobuf" | "http/json";
  /** The traces URL when the config file names it (the env's endpoints the exporter reads). */
  url?: string;
  serviceName: string;
  sampler: Sampler;
}

/** What the environment and the config ask for, or why nothing is exported. */
export function tracesPlan(env: Env, cfg: TelemetryConfig): TracesPlan | { off: string } {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true")
    return { off: "OTEL_SDK_DISABLED=true" };
  const exporter = env.OTEL_TRACES_EXPORTER?.trim().toLowerCase();
  if (exporter === "none") return { off: "OTEL_TRACES_EXPORTER=none" };
  if (exporter && exporter !== "otlp")
    throw new Error(
      `OTEL_TRACES_EXPORTER=${exporter} is not supported: use otlp (or none), and set OTEL_EXPORTER_OTLP_ENDPOINT`,
    );
  const fromEnv = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (!fromEnv && !cfg.otlp_endpoint && exporter !== "otlp") return { off: "not configured" };
  const protocol = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ||
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
      ? { url: `${cfg.otlp_endpoint.replace(/\/+$/, "")}/v1/traces` }
      : {}),
    serviceName: env.OTEL_SERVICE_NAME || cfg.service_name || "tpu-mcp",
    sampler: samplerFrom(env),
  };
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
let users = 0;

/**
 * Starts exporting spans when configured (once per process); returns the app's close hook,
 * which flushes its spans, and shuts the provider down when no app is left.
 */
export function startTelemetry(
  cfg: TelemetryConfig,
  logger: Logger,
  env: Env = process.env,
): () => Promise<void> {
  if (!provider) {
    const plan = tracesPlan(env, cfg);
    if ("off" in plan) return async () => {};
    const exporterConfig = plan.url ? { url: plan.url } : {};
    const exporter: SpanExporter =
      plan.protocol === "http/json"
        ? new JsonExporter(exporterConfig)
        : new ProtoExporter(exporterConfig);
    const delay = Number(env.OTEL_BSP_SCHEDULE_DELAY);
    provider = new BasicTracerProvider({
      sampler: plan.sampler,
      resource: resourceFromAttributes({
        "service.name": plan.serviceName,
        "service.version": SERVER_VERSION,
      }).merge(detectResources({ detectors: [envDetector] })),
      spanProcessors: [
        new BatchSpanProcessor(
          exporter,
          Number.isFinite(delay) && delay >= 0 ? { scheduledDelayMillis: delay } : {},
        ),
      ],
    });
    trace.setGlobalTracerProvider(provider);
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    setTracingEnabled(true);
    logger.info(
      {
        protocol: plan.protocol,
        service: plan.serviceName,
        ...(plan.url ? { url: plan.url } : {}),
      },
      "exporting OpenTelemetry traces",
    );
  }
  users++;
  let released = false;
  return async () => {
    if (released || !provider) return;
    released = true;
    if (--users > 0) return void (await provider.forceFlush());
    const p = provider;
    provider = undefined;
    setTracingEnabled(false);
    await p.shutdown();
    trace.disable();
    propagation.disable();
  };
}
