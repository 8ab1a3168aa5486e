// Issue 23, item 3: the data directory is private. A fresh data dir is made 0700 and every
// store, key and token file in it 0600 (SQLite's -wal/-shm files follow the store); like ssh,
// a folder, store or secret that other users may write is refused, and a folder or store they
// may only read is warned of. Secrets (the webhook secret, the generated bearer token, the audit
// key) are refused as soon as anyone else may read them.
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { readAuditKey } from "../../policies/audit_key.js";
import { createApp } from "../../server/app/app.js";
import { createPolicyServices } from "../../server/app/build_policies.js";
import { parseConfig } from "../../server/config/config.js";
import { createDataDir, FileModeError } from "../../server/config/data_dir.js";
import { ROOT, startHttpServer, writeConfig } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const posix = process.platform !== "win32";
const mode = (p: string) => statSync(p).mode & 0o777;
const silent = pino({ level: "silent" });
const dirs: string[] = [];
function fresh() {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-modes-"));
  dirs.push(dir);
  return dir;
}
function configIn(dir: string, extra: Record<string, unknown> = {}) {
  return parseConfig(
    { data_dir: join(dir, "data"), runtime: { start: "lazy", device: "cpu" }, ...extra },
    { root: ROOT, base: dir },
  );
}
afterAll(() => {
  for (const d of dirs)
    for (const p of [d, join(d, "data")]) if (existsSync(p)) chmodSync(p, 0o700);
});

describe.skipIf(!posix)("file modes of the data directory", () => {
  it("makes a fresh data dir 0700 and every store, its WAL files and the audit key 0600", async () => {
    const dir = fresh();
    const config = configIn(dir);
    const policy = await createPolicyServices(config, silent);
    // Write something, so SQLite makes its -wal and -shm files.
    policy.approvals.create({
      principal: "agent",
      tool: "get_job",
      args_digest: "d",
      args_preview: {},
      ttl_s: 60,
    });
    const data = join(dir, "data");
    expect(mode(data)).toBe(0o700);
    const files = readdirSync(data);
    expect(files).toEqual(
      expect.arrayContaining([
        "policy.db",
        "policy.db-wal",
        "audit.key",
        "jobs.db",
        "reports.db",
        "workers.db",
      ]),
    );
    for (const f of files) expect([f, mode(join(data, f))]).toEqual([f, 0o600]);
    policy.close();
  });

  it("refuses a data dir or store others may write, and warns of one they may read", () => {
    const dir = fresh();
    const config = configIn(dir);
    const data = join(dir, "data");
    mkdirSync(data, { mode: 0o755 });
    chmodSync(data, 0o755);
    const warnings: string[] = [];
    createDataDir(config, { warn: (m) => warnings.push(m) });
    expect(warnings.join("\n")).toMatch(
      /data directory .* readable by other users \(mode 755\); run: chmod 700/,
    );
    chmodSync(data, 0o777);
    expect(() => createDataDir(config)).toThrow(FileModeError);
    expect(() => createDataDir(config)).toThrow(/writable by other users \(mode 777\).*chmod 700/);
    chmodSync(data, 0o700);
    chmodSync(join(data, "policy.db"), 0o644);
    warnings.length = 0;
    createDataDir(config, { warn: (m) => warnings.push(m) });
    expect(warnings.join("\n")).toMatch(/policy\.db is readable by other users \(mode 644\)/);
    chmodSync(join(data, "policy.db"), 0o664);
    expect(() => createDataDir(config)).toThrow(/policy\.db is writable by other users/);
  });

  it("refuses an audit key others may read, or whose folder others may write", async () => {
    const dir = fresh();
    const keyDir = join(dir, "keys");
    mkdirSync(keyDir, { mode: 0o700 });
    const config = configIn(dir, { policy: { audit: { key_file: join(keyDir, "audit.key") } } });
    await (await createPolicyServices(config, silent)).close();
    expect(mode(join(keyDir, "audit.key"))).toBe(0o600);
    expect(readAuditKey(join(keyDir, "audit.key"))).not.toBeNull();
    chmodSync(keyDir, 0o777);
    expect(() => readAuditKey(join(keyDir, "audit.key"))).toThrow(
      /folder .* writable by other users/,
    );
    chmodSync(keyDir, 0o700);
    chmodSync(join(keyDir, "audit.key"), 0o644);
    expect(() => readAuditKey(join(keyDir, "audit.key"))).toThrow(/chmod 600/);
  });

  it("refuses a webhook secret others may read (it was accepted at 0644)", async () => {
    const dir = fresh();
    writeFileSync(join(dir, "hook.secret"), "whsec-0123456789abcdef\n", { mode: 0o644 });
    chmodSync(join(dir, "hook.secret"), 0o644);
    const config = configIn(dir, {
      policy: {
        approvals: { notify: [{ url: "http://127.0.0.1:9/hook", secret_file: "hook.secret" }] },
      },
    });
    await expect(createApp(config, silent)).rejects.toThrow(
      /webhook secret .*\(mode 644\).*chmod 600/,
    );
  });

  it(
    "`tpu-mcp http` makes its generated token 0600 and refuses one others may read",
    { timeout: scaled(120_000) },
    async () => {
      const dir = fresh();
      const cfg = writeConfig({ runtime: { start: "lazy", device: "cpu" }, policy: {} }, dir);
      const server = await startHttpServer(cfg);
      await server.stop();
      const data = join(dir, "data");
      expect(mode(data)).toBe(0o700);
      expect(mode(join(data, "local-token"))).toBe(0o600);
      expect(mode(join(data, "policy.db"))).toBe(0o600);
      chmodSync(join(data, "local-token"), 0o644);
      await expect(startHttpServer(cfg)).rejects.toThrow(/generated bearer token .* chmod 600/);
    },
  );
});
