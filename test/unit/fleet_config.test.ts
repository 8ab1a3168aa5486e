// runtime.ray in the server config: shape, the token rule, paths relative to the config file.
import { describe, expect, it } from "vitest";
import { ConfigError, parseConfig } from "../../server/config/config.js";
import { driverConfig } from "../../server/config/ray.js";

const ray = {
  address: "10.0.0.2:6379",
  token_file: "secrets/ray-token",
  actor: { catalog: "/srv/tpu-mcp/catalog.json" },
  channel: { client_ca: "pki/ca.crt", token_file: "secrets/worker-token" },
  client: { cert: "pki/control.crt", key: "pki/control.key" },
};
const parse = (r: unknown) =>
  parseConfig({ runtime: { ray: r } }, { root: "/repo", base: "/etc/tpu-mcp", source: "t.json" });

describe("runtime.ray", () => {
  it("resolves the control host's paths against the config file, leaves the nodes' catalog alone", () => {
    const c = parse(ray).runtime.ray!;
    expect(c.token_file).toBe("/etc/tpu-mcp/secrets/ray-token");
    expect(c.channel).toEqual({
      client_ca: "/etc/tpu-mcp/pki/ca.crt",
      token_file: "/etc/tpu-mcp/secrets/worker-token",
    });
    expect(c.client.key).toBe("/etc/tpu-mcp/pki/control.key");
    expect(c.actor.catalog).toBe("/srv/tpu-mcp/catalog.json");
    expect(c.placement.mode).toBe("per-chip");
    // The driver never gets the control plane's private key.
    expect(JSON.stringify(driverConfig(c))).not.toContain("control.key");
  });

  it("refuses a cluster without Ray token auth unless it is a loopback test cluster", () => {
    const { token_file: _t, ...noToken } = ray;
    expect(() => parse(noToken)).toThrow(ConfigError);
    expect(() => parse(noToken)).toThrow(/token_file is required/);
    expect(() => parse({ ...noToken, allow_insecure_local: true })).not.toThrow();
  });

  it("names the field that is wrong", () => {
    expect(() => parse({ ...ray, placement: { mode: "anywhere" } })).toThrow(
      /runtime\.ray\.placement\.mode/,
    );
    expect(() => parse({ ...ray, actor: { catalog: "/c.json", code: "import os" } })).toThrow(
      ConfigError,
    );
    expect(() => parse({ ...ray, placement: { mode: "per-host", chips_per_host: 3 } })).toThrow(
      /chips_per_host/,
    );
  });
});
