// `tpu-mcp doctor`'s Ray fleet section without a cluster: not configured is not a problem and
// touches nothing; a configured fleet names each unreadable file and an unreachable cluster; and
// once the cluster takes the token, what the actors will need on the nodes is checked there (here
// against a stand-in Python that answers as Ray would; the real cluster is in the Ray suite).
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../server/config/config.js";
import { checkFleet, parsePreflight } from "../../server/doctor/fleet.js";
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

  it("checks on the nodes what the actors need, and names each problem with its fix", async () => {
    // A GCS port that answers, and a Python that answers as a token-checking Ray cluster whose
    // nodes lack the worker package and TPU chips (the two set-ups the doctor used to call fine).
    const gcs = createServer((s) => s.destroy());
    await new Promise<void>((r) => gcs.listen(0, "127.0.0.1", r));
    const port = (gcs.address() as AddressInfo).port;
    const seen = join(dir, "preflight-config.json");
    const fakePython = join(dir, "python");
    // What tpu_worker.fleet.preflight prints for such nodes (its own tests check the wording).
    const answer = join(dir, "preflight-answer");
    writeFileSync(
      answer,
      [
        "Connecting to existing Ray cluster",
        JSON.stringify({
          name: "actor import",
          ok: false,
          detail:
            "node 127.0.0.1 (abcd1234): the actors cannot import 'tpu_worker' on their node (ModuleNotFoundError): install the worker package on every Ray node",
          code: "ray_actor_import_failed",
        }),
        JSON.stringify({
          name: "actor device",
          ok: false,
          detail:
            "node 127.0.0.1 (abcd1234): the actors ask for device 'tpu' but their node cannot provide it (no TPU chips): on hosts without TPUs set runtime.ray.actor.device: \"cpu\"",
          code: "ray_actor_device_unavailable",
        }),
        "",
      ].join("\n"),
    );
    writeFileSync(
      fakePython,
      [
        "#!/bin/sh",
        'case "$*" in',
        '  *"import ray; print"*) echo 2.60.0 ;;',
        "  *tpu_worker.fleet.probe*) echo refused ;;",
        "  *GcsClient*) echo accepted ;;",
        `  *tpu_worker.fleet.preflight*) cp "$4" '${seen}'; echo "$4" > '${seen}.path'; cat '${answer}'; exit 1 ;;`,
        "  *) exit 3 ;;",
        "esac",
        "",
      ].join("\n"),
      { mode: 0o755 },
    );
    writeFileSync(join(dir, "ray-token"), "t".repeat(32));
    writeFileSync(join(dir, "ca.crt"), "-----BEGIN CERTIFICATE-----");
    const config = parseConfig(
      {
        runtime: {
          python: fakePython,
          ray: {
            address: `127.0.0.1:${port}`,
            token_file: "ray-token",
            actor: { catalog: "/srv/catalog.json" },
            channel: { client_ca: "ca.crt", token_file: "ray-token" },
            client: { cert: "ca.crt", key: "ray-token" },
          },
        },
      },
      { root: ROOT, base: dir, source: "t.json" },
    );
    try {
      const checks = (await checkFleet(config))!;
      const byName = Object.fromEntries(checks.map((c) => [c.name, c]));
      expect(byName.token).toMatchObject({ ok: true });
      expect(byName["actor import"]).toMatchObject({ ok: false });
      expect(byName["actor import"].detail).toMatch(/cannot import 'tpu_worker'/);
      expect(byName["actor device"]).toMatchObject({ ok: false });
      expect(byName["actor device"].detail).toMatch(/actor\.device: "cpu"/);
      // The pre-check got the driver's own config (no client key), and its file is gone.
      const given = JSON.parse(readFileSync(seen, "utf8")) as Record<string, unknown>;
      expect(given).toMatchObject({
        address: `127.0.0.1:${port}`,
        actor: { catalog: "/srv/catalog.json" },
      });
      expect(given).not.toHaveProperty("client");
    } finally {
      gcs.close();
    }
    expect(existsSync(readFileSync(`${seen}.path`, "utf8").trim())).toBe(false);
  });

  it("a pre-check that printed nothing of ours is a problem, not a pass", () => {
    expect(parsePreflight("Connecting to Ray", "Traceback\nRuntimeError: boom", 1)).toEqual([
      {
        name: "actor nodes",
        ok: false,
        detail: expect.stringMatching(
          /could not check the nodes the actors will use \(exit 1\): RuntimeError: boom/,
        ),
      },
    ]);
  });
});
