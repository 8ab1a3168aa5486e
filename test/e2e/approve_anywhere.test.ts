// A clone's server over stdio, as a desktop host starts it, on the default approval rules: the
// approval_required text names a command that decides the approval pasted as shown into a shell
// in a new empty folder with an empty HOME (not the clone's folder), and says how to serve a
// console on the same data, since a stdio server has none.
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, connectStdio, errorOf } from "../helpers/server.js";
import { call } from "./scenario.js";
import { scaled } from "../helpers/calibrate.js";

const run = promisify(execFile);
const BENCH = { model: "mnist-cnn", batch_sizes: [1], iterations: 2, warmup: 1 };

describe("over stdio, the printed approve command works from any folder", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-anywhere-"));
  // No policy section: the default rules (a benchmark waits for a human) and the embedded
  // operator token; only the data dir is this test's own.
  const config = join(dir, "config.json");
  writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data"), log_level: "warn" }));
  let agent: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    agent = await connectStdio(config);
  });
  afterAll(async () => {
    await agent?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("names the command and a console to start; pasted in a new folder, it decides the approval", async () => {
    const first = await call(agent.client, "run_benchmark", BENCH);
    const e = errorOf(first)!;
    expect(e.code).toBe("approval_required");
    const id = e.details.approval_id as string;
    const shown = (first.content as { type: string; text?: string }[])[0].text!;
    const commands = [...shown.matchAll(/`([^`]+)`/g)].map((m) => m[1]);
    const approve = commands.find((c) => c.includes(" approvals approve "))!;

    // A shell in a folder that is not the clone, with an empty HOME and this Node on PATH.
    const elsewhere = mkdtempSync(join(dir, "paste-"));
    const decided = await run("/bin/sh", ["-c", approve], {
      cwd: elsewhere,
      env: { HOME: elsewhere, PATH: `${dirname(process.execPath)}:/usr/bin:/bin` },
      timeout: scaled(60_000),
    });
    expect(decided.stdout).toMatch(/^approved: /);
    // The clone's bin by absolute path with the server's config; the console is the HTTP
    // server's on the same config, at its configured port.
    expect(commands).toEqual([
      `node ${CLI} http --config ${config}`,
      `node ${CLI} approvals approve ${id} --config ${config}`,
    ]);
    expect(shown).toContain("http://localhost:7801/console/");

    const ok = await call(agent.client, "run_benchmark", { ...BENCH, approval_id: id });
    expect(ok.isError, JSON.stringify(ok.content)).toBeFalsy();
  });
});
