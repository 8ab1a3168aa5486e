// `tpu-mcp doctor`'s Ray fleet section without a cluster: not configured is not a problem and
// touches nothing; a configured fleet names each unreadable file and an unreachable cluster.
// (The checks against a live cluster, token refused or accepted, run in the Ray suite's setting
// only through the fleet driver; here no Ray cluster is started.)
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../server/config/config.js";
import { checkFleet } from "../../server/doctor/fleet.js";
import { ROOT } from "../helpers/server.js";

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-doctor-fleet-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("doctor: Ray fleet", () => {
  it("without runtime.ray: nothing to check", async () => {
    expect(await checkFleet(parseConfig({}, { root: ROOT }))).toBeNull();
  });

  it("names unreadable files and a cluster nobody listens on", async () => {
    writeFileSync(join(dir, "ray-token"), "t".repeat(32));
    const config = parseConfig(
      {
        runtime: {
          python: join(ROOT, ".venv/bin/python"),
          ray: {
            address: "127.0.0.1:1",
            token_file: "ray-token",
            actor: { catalog: "/srv/catalog.json" },
            channel: { client_ca: "missing-ca.crt", token_file: "ray-token" },
            client: { cert: "missing.crt", key: "missing.key" },
          },
        },
      },
      { root: ROOT, base: dir, source: "t.json" },
    );
    const checks = (await checkFleet(config))!;
    const byName = Object.fromEntries(checks.map((c) => [c.name, c]));
    expect(byName["runtime.ray.token_file"].ok).toBe(true);
    expect(byName["runtime.ray.channel.client_ca"]).toMatchObject({ ok: false });
    expect(byName["runtime.ray.channel.client_ca"].detail).toMatch(/missing-ca\.crt \(ENOENT\)/);
    expect(byName["runtime.ray.client.key"].ok).toBe(false);
    expect(byName.ray).toMatchObject({ ok: true });
    expect(byName.ray.detail).toMatch(/^Ray \d+\.\d+/);
    expect(byName.cluster).toMatchObject({ ok: false });
    expect(byName.cluster.detail).toMatch(
      /cannot reach the Ray cluster's GCS at 127\.0\.0\.1:1 \(ECONNREFUSED\)/,
    );
  });
});
