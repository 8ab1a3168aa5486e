// Config reload: the diff (what a reload applies, what needs a restart), and the reloader itself
// with a real config file, a real workers.db and `tpu-mcp workers reload`'s CLI side in-process.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import pino from "pino";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createApp, type App } from "../../server/app/app.js";
import { loadConfig, parseConfig } from "../../server/config/config.js";
import { diffConfig } from "../../server/config/diff.js";
import { requestReload } from "../../server/cli/workers.js";
import { SqliteControlChannel } from "../../server/control/channel.js";
import { ROOT } from "../helpers/server.js";

const ray = {
  address: "10.0.0.2:6379",
  token_file: "secrets/ray-token",
  placement: { mode: "per-chip", count: 2 },
  actor: { catalog: "/srv/tpu-mcp/catalog.json" },
  channel: { client_ca: "pki/ca.crt", token_file: "secrets/worker-token" },
  client: { cert: "pki/control.crt", key: "pki/control.key" },
};
const parse = (raw: Record<string, unknown>) =>
  parseConfig(raw, { root: "/repo", base: "/etc/tpu-mcp", source: "t.json" });
const withRay = (placement: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
  parse({ ...extra, runtime: { ray: { ...ray, placement } } });

describe("diffConfig", () => {
  it("an unchanged file: nothing to apply, nothing needs a restart", () => {
    expect(diffConfig(withRay(ray.placement), withRay(ray.placement))).toEqual({ restart: [] });
  });

  it("a new actor count is applied at run time", () => {
    const d = diffConfig(withRay(ray.placement), withRay({ ...ray.placement, count: 3 }));
    expect(d).toEqual({ fleet_count: 3, restart: [] });
  });

  it("a removed count means every slot the placement offers", () => {
    const d = diffConfig(withRay(ray.placement), withRay({ mode: "per-chip" }));
    expect(d).toEqual({ fleet_count: "capacity", restart: [] });
  });

  it("other changes are named by their dotted path as needing a restart", () => {
    const d = diffConfig(
      withRay(ray.placement),
      withRay({ mode: "per-host", count: 1 }, { log_level: "debug", data_dir: "elsewhere" }),
    );
    expect(d.fleet_count).toBe(1);
    expect(d.restart).toEqual([
      "data_dir",
      "log_level",
      "paths.data_dir",
      "runtime.ray.placement.mode",
    ]);
  });

  it("adding or removing the Ray fleet needs a restart (there is no fleet to scale, or one to start)", () => {
    const d = diffConfig(parse({}), withRay(ray.placement));
    expect(d.fleet_count).toBeUndefined();
    expect(d.restart).toEqual(["runtime.ray"]);
  });

  it("a list (tokens, workers) changes as one setting", () => {
    const tok = (id: string) => ({ id, token_sha256: id.repeat(64), scopes: ["admin"] });
    const d = diffConfig(
      parse({ policy: { tokens: [tok("a")] } }),
      parse({ policy: { tokens: [tok("a"), tok("b")] } }),
    );
    expect(d).toEqual({ restart: ["policy.tokens"] });
  });

  it("the approval policy is applied at run time; the rest of the policy still needs a restart", () => {
    const d = diffConfig(
      parse({ policy: { approvals: { rules: [{ tool: "load_model" }] } } }),
      parse({
        policy: {
          approvals: { rules: [{ tool: "load_model", principals: ["agent"] }], ttl_s: 60 },
          limits: { rate_limit: { per_principal_per_minute: 7 } },
        },
      }),
    );
    expect(d).toEqual({
      approvals: ["policy.approvals.rules", "policy.approvals.ttl_s"],
      restart: ["policy.limits.rate_limit.per_principal_per_minute"],
    });
  });
});

describe("reload (a real file, workers.db, the CLI's request in-process)", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-reload-"));
  const file = join(dir, "config.json");
  let app: App | undefined;
  const logs: string[] = [];
  const logger = pino({ level: "info" }, { write: (s: string) => void logs.push(s) });
  const base = {
    data_dir: join(dir, "data"),
    runtime: { start: "lazy", python: join(ROOT, ".venv/bin/python") },
  };
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const io = () => {
    const out: string[] = [];
    const err: string[] = [];
    return {
      out,
      err,
      io: {
        out: (s: string) => out.push(s),
        err: (s: string) => err.push(s),
        json: false,
        waitMs: 10_000,
      },
    };
  };

  it("refuses an invalid file with a clear log line and changes nothing", async () => {
    writeFileSync(file, JSON.stringify(base));
    const config = loadConfig(file, ROOT);
    app = await createApp(config, logger, { loadConfig: () => loadConfig(file, ROOT) });
    writeFileSync(file, JSON.stringify({ ...base, log_level: "loud" }));
    const r = await app.reload("test");
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/log_level/);
    expect(logs.join("")).toMatch(/config reload refused, nothing changed/);
    // Fixed again: the reload sees the same settings as the running server.
    writeFileSync(file, JSON.stringify(base));
    expect(await app.reload("test")).toEqual({ ok: true, applied: [], restart: [] });
  });

  it("`workers reload`: the server re-reads the file and reports what needs a restart", async () => {
    writeFileSync(file, JSON.stringify(base));
    const config = loadConfig(file, ROOT);
    app = await createApp(config, logger, { loadConfig: () => loadConfig(file, ROOT) });
    writeFileSync(file, JSON.stringify({ ...base, log_level: "debug" }));
    const t = io();
    expect(await requestReload(config, "ops", t.io)).toBe(0);
    expect(t.out.join("\n")).toMatch(/nothing to apply at run time/);
    expect(t.out.join("\n")).toMatch(/needs a restart: log_level/);
    // An invalid file: the CLI says so and exits 1.
    writeFileSync(file, "{ not json");
    const t2 = io();
    expect(await requestReload(config, "ops", t2.io)).toBe(1);
    expect(t2.err.join("\n")).toMatch(/reload refused, nothing changed: .*not valid JSON/s);
  });

  it("a server started without a file has nothing to reload, and says so", async () => {
    app = await createApp(parseConfig(base, { root: ROOT }), logger);
    const r = await app.reload("SIGHUP");
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/without a config file/);
  });

  it("a new Ray count is recorded as the fleet's target through the `workers scale` path", async () => {
    // No cluster here: the reloader's part ends at the desired state in workers.db, which the
    // fleet watcher applies (the Ray e2e suite covers the rest).
    const { createReloader } = await import("../../server/control/reload.js");
    const rayRaw = (count: number) => ({
      ...base,
      runtime: { ...base.runtime, ray: { ...ray, placement: { mode: "per-chip", count } } },
    });
    writeFileSync(file, JSON.stringify(rayRaw(2)));
    const running = loadConfig(file, ROOT);
    const fakeRuntime = {} as Parameters<typeof createReloader>[2];
    mkdirSync(join(dir, "data"), { recursive: true });
    const channel = SqliteControlChannel.open(join(dir, "data", "workers.db"));
    const reloader = createReloader(
      running,
      () => loadConfig(file, ROOT),
      fakeRuntime,
      logger,
      channel,
    );
    writeFileSync(file, JSON.stringify(rayRaw(3)));
    const r = await reloader.reload("test");
    expect(r).toMatchObject({ ok: true, fleet_target: 3, restart: [] });
    expect(r.applied[0]).toMatch(/runtime\.ray\.placement\.count: 2 -> 3/);
    const db = new Database(join(dir, "data", "workers.db"), { readonly: true });
    try {
      expect(db.prepare("SELECT count, by FROM fleet_target").get()).toEqual({
        count: 3,
        by: "config-reload (test)",
      });
    } finally {
      db.close();
    }
    // The same file again: applied once, so nothing more to do.
    expect(await reloader.reload("test")).toEqual({ ok: true, applied: [], restart: [] });
    expect(readFileSync(file, "utf8")).toContain('"count":3');
    channel.close();
  });
});
