// Which OTEL_* settings turn traces on, and the clear refusals of what the server cannot do
// (server/app/telemetry.ts).
import { describe, expect, it } from "vitest";
import { metricsPlan, samplerFrom, tracesPlan } from "../../server/app/telemetry.js";

describe("tracesPlan", () => {
  it("is off unless an endpoint is configured, and OTEL_SDK_DISABLED wins", () => {
    expect(tracesPlan({}, {})).toEqual({ off: "not configured" });
    expect(
      tracesPlan({ OTEL_TRACES_EXPORTER: "none", OTEL_EXPORTER_OTLP_ENDPOINT: "http://x" }, {}),
    ).toEqual({ off: "OTEL_TRACES_EXPORTER=none" });
    expect(
      tracesPlan({ OTEL_SDK_DISABLED: "true", OTEL_EXPORTER_OTLP_ENDPOINT: "http://x" }, {}),
    ).toEqual({ off: "OTEL_SDK_DISABLED=true" });
  });

  it("takes the env's endpoint as the exporter reads it, the config's as {url}/v1/traces", () => {
    const env = tracesPlan({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://c:4318/t" }, {});
    expect(env).toMatchObject({ protocol: "http/protobuf", serviceName: "tpu-mcp" });
    expect(env).not.toHaveProperty("url");
    const file = tracesPlan(
      {},
      { otlp_endpoint: "http://c:4318/", otlp_protocol: "http/json", service_name: "edge" },
    );
    expect(file).toMatchObject({
      url: "http://c:4318/v1/traces",
      protocol: "http/json",
      serviceName: "edge",
    });
    expect(
      tracesPlan({ OTEL_SERVICE_NAME: "a" }, { otlp_endpoint: "http://c", service_name: "b" }),
    ).toMatchObject({ serviceName: "a" });
  });

  it("refuses what it cannot do, saying what to use", () => {
    expect(() =>
      tracesPlan(
        { OTEL_EXPORTER_OTLP_ENDPOINT: "http://x", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
        {},
      ),
    ).toThrow(/http\/protobuf or http\/json/);
    expect(() => tracesPlan({ OTEL_TRACES_EXPORTER: "zipkin" }, {})).toThrow(/use otlp/);
    expect(() => samplerFrom({ OTEL_TRACES_SAMPLER: "sometimes" })).toThrow(/always_on/);
    expect(() =>
      samplerFrom({ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "2" }),
    ).toThrow(/between 0 and 1/);
  });

  it("reads the sampler as the SDK specification names it", () => {
    expect(samplerFrom({}).toString()).toMatch(/ParentBased/);
    expect(samplerFrom({ OTEL_TRACES_SAMPLER: "always_off" }).toString()).toMatch(/AlwaysOff/);
    expect(
      samplerFrom({
        OTEL_TRACES_SAMPLER: "traceidratio",
        OTEL_TRACES_SAMPLER_ARG: "0.25",
      }).toString(),
    ).toMatch(/0\.25/);
  });
});

describe("metricsPlan", () => {
  it("follows the same endpoint, with its own switches, interval and {url}/v1/metrics", () => {
    expect(metricsPlan({}, {})).toEqual({ off: "not configured" });
    const both = { OTEL_EXPORTER_OTLP_ENDPOINT: "http://x" };
    expect(metricsPlan(both, {})).toMatchObject({ protocol: "http/protobuf", intervalMs: 60_000 });
    expect(metricsPlan({ ...both, OTEL_METRICS_EXPORTER: "none" }, {})).toEqual({
      off: "OTEL_METRICS_EXPORTER=none",
    });
    // Traces off leaves metrics on, and the other way round.
    expect(metricsPlan({ ...both, OTEL_TRACES_EXPORTER: "none" }, {})).not.toHaveProperty("off");
    expect(
      metricsPlan(
        { OTEL_METRIC_EXPORT_INTERVAL: "250", OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: "http/json" },
        { otlp_endpoint: "http://c:4318/" },
      ),
    ).toMatchObject({ url: "http://c:4318/v1/metrics", protocol: "http/json", intervalMs: 250 });
    expect(() => metricsPlan({ ...both, OTEL_METRIC_EXPORT_INTERVAL: "soon" }, {})).toThrow(
      /milliseconds/,
    );
    expect(() => metricsPlan({ ...both, OTEL_METRICS_EXPORTER: "prometheus" }, {})).toThrow(
      /use otlp/,
    );
  });
});
