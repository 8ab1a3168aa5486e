// `tpu-mcp workers scale N` against a stand-in server (the fleet's side of workers.db written
// here): a refusal is audited as one, with the fleet's code and reason; while the fleet moves the
// CLI says on stderr what it waits for (serving/target, the last actor error), and why it gives up.
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createPolicyServices } from "../../server/app/build_policies.js";
import { runWorkersCommand } from "../../server/cli/workers.js";
import { parseConfig } from "../../server/config/config.js";
import { createDataDir } from "../../server/config/data_dir.js";
import { SqliteControlChannel, type PublishedFleet } from "../../server/control/channel.js";
import { ROOT } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const TOKEN = "scale-test-admin-token-0123456789";
const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-workers-scale-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const logger = pino({ level: "silent" });

let n = 0;
function setup() {
  const config = parseConfig(
    {
      data_dir: join(dir, `data${n++}`),
      policy: {
        tokens: [
          {
            id: "ops",
            token_sha256: createHash("sha256").update(TOKEN).digest("hex"),
            scopes: ["admin"],
          },
        ],
      },
      runtime: {
        ray: {
          address: "10.0.0.2:6379",
          token_file: "ray-token",
          actor: { catalog: "/srv/catalog.json" },
          channel: { client_ca: "ca.crt", token_file: "worker-token" },
          client: { cert: "control.crt", key: "control.key" },
        },
      },
    },
    { root: ROOT, base: dir, source: "t.json" },
  );
  const out: string[] = [];
  const err: string[] = [];
  const io = {
    out: (s: string) => out.push(s),
    err: (s: string) => err.push(s),
    json: false,
    logger,
    token: TOKEN,
    waitMs: 2_000,
  };
  return { config, out, err, io };
}

/** The server's side: once the CLI has written a target, publish `status` (and `error`) for it. */
let stopServer: (() => void) | undefined;
function fakeServer(
  config: ReturnType<typeof setup>["config"],
  status: PublishedFleet,
  error: string | null,
) {
  const channel = SqliteControlChannel.open(createDataDir(config).workersDb);
  const t = setInterval(() => {
    void (async () => {
      const want = await channel.fleetTarget();
      if (want) await channel.publishFleet(want.count, status, error);
    })();
  }, 100);
  stopServer = () => {
    clearInterval(t);
    channel.close();
  };
}
afterEach(() => stopServer?.());

async function scaleAudit(config: ReturnType<typeof setup>["config"]) {
  const policy = await createPolicyServices(config, logger);
  try {
    return (await policy.audit.tail(20)).filter((r) => r.tool === "workers.scale");
  } finally {
    await policy.close();
  }
}

const up = (name: string) => ({ name, state: "up", restarts: 0, endpoint: null });

describe("tpu-mcp workers scale", () => {
  it("a refused scale is audited as failed with the fleet's code and reason, not as executed", async () => {
    const t = setup();
    fakeServer(
      t.config,
      { state: "ready", target: 2, actors: [up("ray-0"), up("ray-1")] } as PublishedFleet,
      "out_of_range: the fleet can hold at most 4 worker(s) (per-chip placement over the chips it reserved)",
    );
    expect(await runWorkersCommand(t.config, ["scale", "5"], t.io)).toBe(1);
    expect(t.err.join("\n")).toMatch(/scale 5 refused: out_of_range: the fleet can hold at most 4/);
    const audit = await scaleAudit(t.config);
    expect(audit.map((r) => r.outcome)).toEqual(["allowed", "failed"]);
    expect(audit[1]).toMatchObject({
      principal: "ops",
      args: { count: 5 },
      code: "out_of_range",
      reason: expect.stringMatching(/^the fleet can hold at most 4 worker/),
    });
  });

  it("says what it waits for (serving/target, the last actor error) and why it gives up", async () => {
    const t = setup();
    const reason =
      "the actors cannot import 'tpu_worker' on their node (ModuleNotFoundError): install the worker package on every Ray node";
    fakeServer(
      t.config,
      {
        state: "ready",
        target: 2,
        actors: [up("ray-0"), { ...up("ray-1"), state: "lost", restarts: 2 }],
        last_actor_error: { name: "ray-1", reason, code: "ray_actor_import_failed" },
      } as PublishedFleet,
      null,
    );
    expect(await runWorkersCommand(t.config, ["scale", "2"], t.io)).toBe(1);
    const err = t.err.join("\n");
    expect(err).toContain(
      `waiting for 2 worker(s): 1/2 serving; ray-1 lost; last actor error: ray-1: ${reason}`,
    );
    expect(err).toMatch(
      /scale 2 recorded, but the fleet did not reach it after 2 s: 1\/2 serving; ray-1 lost; last actor error: ray-1: the actors cannot import 'tpu_worker'/,
    );
    // Progress is printed when it changes, not on every poll.
    expect(t.err.filter((l) => l.startsWith("waiting for")).length).toBe(1);
    const audit = await scaleAudit(t.config);
    expect(audit.map((r) => r.outcome)).toEqual(["allowed", "executed"]);
    expect(audit[1].reason).toMatch(/^target recorded, not reached: after 2 s: 1\/2 serving/);
  });

  it("a refused fleet driver ends the wait at once with its reason", async () => {
    const t = setup();
    fakeServer(
      t.config,
      {
        state: "refused",
        error: {
          code: "ray_actor_device_unavailable",
          message: 'set runtime.ray.actor.device: "cpu"',
        },
      } as PublishedFleet,
      'ray_actor_device_unavailable: set runtime.ray.actor.device: "cpu"',
    );
    const started = Date.now();
    expect(await runWorkersCommand(t.config, ["scale", "2"], { ...t.io, waitMs: 30_000 })).toBe(1);
    expect(Date.now() - started).toBeLessThan(scaled(10_000));
    expect(t.err.join("\n")).toMatch(
      /scale 2 refused: ray_actor_device_unavailable: set runtime\.ray\.actor\.device: "cpu"/,
    );
    expect((await scaleAudit(t.config)).map((r) => [r.outcome, r.code])).toEqual([
      ["allowed", undefined],
      ["failed", "ray_actor_device_unavailable"],
    ]);
  });
});
