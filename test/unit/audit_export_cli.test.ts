// `tpu-mcp audit head | export | verify-export` through the real bin, and the receiver's verifier
// bundled on its own (dist/verify-export.mjs's recipe) and run by plain node from a folder with
// no tpu-mcp, no node_modules, no data dir and no key.
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { build } from "esbuild";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { loadOrCreateAuditKey } from "../../policies/audit_key.js";
import { CLI, cli, ROOT, writeConfig } from "../helpers/server.js";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-export-"));
const config = writeConfig({}, dir);
const data = join(dir, "data");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Plain node on the standalone verifier: exit code and output. */
async function standalone(bundle: string, ...args: string[]) {
  try {
    const r = await run(process.execPath, [bundle, ...args], { cwd: dir });
    return { code: 0, out: r.stdout + r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout + x.stderr };
  }
}

describe("audit export through the CLI", () => {
  beforeAll(async () => {
    const { key, created } = loadOrCreateAuditKey(join(data, "audit.key"));
    const log = new SqliteAuditTrail(join(data, "policy.db"), { key, keyCreated: created });
    await Promise.all(
      Array.from({ length: 500 }, (_, i) =>
        log.appendDurable({
          time: new Date(Date.now() + i).toISOString(),
          principal: "agent",
          tool: "run_inference",
          args_digest: null,
          outcome: i % 4 === 0 ? "denied" : "executed",
        }),
      ),
    );
    log.close();
  });

  it("head, export to a file, verify-export: ok; an edited line: BROKEN at its seq", async () => {
    const head = await cli(config, "audit", "head");
    expect(head.code).toBe(0);
    const h = JSON.parse(head.stdout) as { seq: number; export_hash: string };
    expect(h.seq).toBe(501);
    expect(h.export_hash).toMatch(/^[0-9a-f]{64}$/);
    writeFileSync(join(dir, "head.json"), head.stdout);

    const file = join(dir, "export.jsonl");
    const exp = await cli(config, "audit", "export", "--since", "1", "--out", file);
    expect(exp.code).toBe(0);
    expect(exp.stderr).toContain(
      `exported records 1..501 (501); head #501 export_hash ${h.export_hash}`,
    );
    const ok = await cli(config, "audit", "verify-export", file, "--head", h.export_hash);
    expect(ok).toMatchObject({ code: 0 });
    expect(ok.stdout).toMatch(/^ok: records 1\.\.501 \(501\) are a gap-free/);
    // The head file `audit head` wrote works as --head too.
    expect(
      (await cli(config, "audit", "verify-export", file, "--head", join(dir, "head.json"))).code,
    ).toBe(0);

    const lines = readFileSync(file, "utf8").split("\n");
    lines[300] = lines[300]!.replace('"outcome":"executed"', '"outcome":"denied"');
    writeFileSync(join(dir, "edited.jsonl"), lines.join("\n"));
    const bad = await cli(
      config,
      "audit",
      "verify-export",
      join(dir, "edited.jsonl"),
      "--head",
      h.export_hash,
    );
    expect(bad.code).toBe(1);
    expect(bad.stdout).toContain("BROKEN at record #301: record 301 was modified");
  });

  it("a reader that falls behind still gets every record from stdout", async () => {
    // A SIEM shipper reading slower than the export writes: the pipe fills, and the CLI must not
    // exit with records still queued (process.exit drops them).
    const { seq } = JSON.parse((await cli(config, "audit", "head")).stdout) as { seq: number };
    const child = spawn(
      process.execPath,
      [CLI, "audit", "export", "--since", "1", "--format", "ocsf", "--config", config],
      { cwd: ROOT, stdio: ["ignore", "pipe", "ignore"] },
    );
    child.stdout.pause();
    const exited = new Promise<number | null>((r) => child.once("exit", r));
    // Sequencing only: the export is far larger than a pipe's buffer, so it waits on the reader.
    await new Promise((r) => setTimeout(r, 1_500));
    const chunks: Buffer[] = [];
    child.stdout.on("data", (c: Buffer) => chunks.push(c));
    child.stdout.resume();
    await new Promise((r) => child.stdout.once("end", r));
    expect(await exited).toBe(0);
    const lines = Buffer.concat(chunks).toString("utf8").trim().split("\n");
    // Every record, then the head line the export ends with.
    expect(lines.length).toBe(seq + 1);
    expect(JSON.parse(lines[seq - 1]!)).toMatchObject({ metadata: { uid: String(seq) } });
  });

  it("exports OCSF on stdout from a seq; bad options say what to give", async () => {
    const head = JSON.parse((await cli(config, "audit", "head")).stdout) as { export_hash: string };
    const exp = await cli(config, "audit", "export", "--since", "400", "--format", "ocsf");
    expect(exp.code).toBe(0);
    const lines = exp.stdout.trim().split("\n");
    expect(lines).toHaveLength(102 + 1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ class_uid: 6003, metadata: { uid: "400" } });
    writeFileSync(join(dir, "ocsf.jsonl"), exp.stdout);
    const v = await cli(
      config,
      "audit",
      "verify-export",
      join(dir, "ocsf.jsonl"),
      "--head",
      head.export_hash,
    );
    expect(v.stdout).toMatch(/^ok: records 400\.\.501/);

    const since = await cli(config, "audit", "export", "--since", "yesterday");
    expect(since.code).toBe(2);
    expect(since.stderr).toMatch(/--since yesterday: give a record's seq .* or an ISO time/);
    const fmt = await cli(config, "audit", "export", "--since", "1", "--format", "csv");
    expect(fmt.stderr).toMatch(/--format csv: use jsonl or ocsf/);
    const noHead = await cli(
      config,
      "audit",
      "verify-export",
      join(dir, "ocsf.jsonl"),
      "--head",
      "nope",
    );
    expect(noHead.code).toBe(2);
    expect(noHead.stderr).toMatch(/give the export_hash \(64 hex digits\)/);
  });

  it("the standalone verifier runs under plain node, alone in a folder", async () => {
    const alone = mkdtempSync(join(tmpdir(), "tpu-mcp-receiver-"));
    try {
      const bundle = join(alone, "verify-export.mjs");
      // The same options as scripts/build.mjs: nothing external, so it must need only Node.
      await build({
        entryPoints: [join(ROOT, "server", "cli", "verify_export_main.ts")],
        outfile: bundle,
        bundle: true,
        platform: "node",
        format: "esm",
        target: "node20",
        logLevel: "error",
      });
      const head = JSON.parse((await cli(config, "audit", "head")).stdout) as {
        export_hash: string;
      };
      const file = join(dir, "export.jsonl");
      expect(await standalone(bundle, file, "--head", head.export_hash)).toMatchObject({
        code: 0,
        out: expect.stringMatching(/^ok: records 1\.\.501/),
      });
      const cut = readFileSync(file, "utf8").split("\n").slice(0, 450).join("\n");
      writeFileSync(join(alone, "cut.jsonl"), cut);
      const r = await standalone(bundle, join(alone, "cut.jsonl"), "--head", head.export_hash);
      expect(r.code).toBe(1);
      expect(r.out).toContain("BROKEN at record #451: the segment 1..450 does not end at the head");
    } finally {
      rmSync(alone, { recursive: true, force: true });
    }
  });
});
