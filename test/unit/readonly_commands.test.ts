// Commands that only read (approvals list/show, audit tail/head/verify, workers list, doctor) never
// create the data directory, a store or the audit key: run on a fresh data directory they leave
// it as it was, and on a store without a key they do not mint one (issue 19, item 6). In-process
// (the commands' own functions), plus one run through the real CLI.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteApprovalQueue } from "../../server/stores/approvals/sqlite.js";
import { runApprovalsCommand, runAuditCommand } from "../../server/cli/operator.js";
import { runWorkersCommand } from "../../server/cli/workers.js";
import { loadConfig } from "../../server/config/config.js";
import { runDoctor } from "../../server/doctor/index.js";
import { cli, ROOT, writeConfig } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const READ_ONLY = [
  "approvals list",
  "approvals show apr_0000",
  "audit tail",
  "audit head",
  "audit verify",
  "workers",
  "workers list",
  "doctor",
];

/** Runs one read-only command in-process: exit code and what it printed. */
async function run(configFile: string, command: string) {
  const config = loadConfig(configFile, ROOT);
  const [name, ...positionals] = command.split(" ");
  const out: string[] = [];
  const err: string[] = [];
  const io = {
    out: (s: string) => void out.push(s),
    err: (s: string) => void err.push(s),
    json: false,
    logger: pino({ level: "silent" }),
  };
  const code =
    name === "approvals"
      ? await runApprovalsCommand(config, positionals, io)
      : name === "audit"
        ? await runAuditCommand(config, positionals, { ...io, n: 20 })
        : name === "workers"
          ? await runWorkersCommand(config, positionals, io)
          : await runDoctor(config, io);
  return { code, stdout: out.join("\n"), stderr: err.join("\n") };
}

/** Every file and folder under `dir`, relative to it (empty when it does not exist). */
function tree(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, encoding: "utf8" }).sort();
}

describe("read-only commands on a fresh data directory", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-ro-"));
  // A missing Python keeps `doctor` short (no worker starts); it still reads the config and
  // reports the data directory, which is what could create files.
  const config = writeConfig({ runtime: { python: join(dir, "no-python") } }, dir);
  const data = join(dir, "data");
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it.each(READ_ONLY)("`tpu-mcp %s` creates nothing", async (command) => {
    const r = await run(config, command);
    expect(r.stderr).not.toMatch(/TAMPERED|misconfigured/);
    expect(existsSync(data)).toBe(false);
    expect(readdirSync(dir)).toEqual(["config.json"]);
  });

  it("they say what an empty store says, and that there is nothing yet", async () => {
    const list = await run(config, "approvals list");
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/no approvals/);
    expect(list.stderr).toMatch(/no policy store yet/);
    const workers = await run(config, "workers list");
    expect(workers.code).toBe(0);
    expect(workers.stdout).toMatch(/no worker state recorded/);
    const verify = await run(config, "audit verify");
    expect(verify.code).toBe(0);
    expect(verify.stdout).toMatch(/^ok: 0 record/);
  });

  it("through the real CLI too", { timeout: scaled(60_000) }, async () => {
    const r = await cli(config, "approvals", "list");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/no approvals/);
    expect(existsSync(data)).toBe(false);
  });
});

describe("read-only commands on a store without an audit key", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-ro-"));
  const config = writeConfig({}, dir);
  const data = join(dir, "data");
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("never mint the key or new stores", async () => {
    // A policy store with an approvals table and no key, as an older server left it.
    mkdirSync(data);
    new SqliteApprovalQueue(join(data, "policy.db")).close();
    const stores = () => tree(data).filter((f) => !/-(wal|shm)$/.test(f));
    const before = stores();
    for (const command of READ_ONLY.filter((c) => c !== "doctor")) {
      const r = await run(config, command);
      expect(r.stderr, command).not.toMatch(/TAMPERED|misconfigured/);
    }
    // SQLite may leave its -wal/-shm files beside the store it read; nothing else appears.
    expect(stores()).toEqual(before);
    expect(existsSync(join(data, "audit.key"))).toBe(false);
  });
});
