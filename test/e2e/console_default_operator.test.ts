// The embedded default's operator (no tokens in the config: what `npm start` serves) signs in to
// the console as the start banner says, with the generated operator token, and opens every page
// the console has, the Runtime page included (it runs get_runtime_status through the gate).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHttpServer, type HttpServerProc } from "../helpers/server.js";

describe("the default local operator in the console", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-default-operator-"));
  // Only the data dir differs from `npm start` (the shared .data is not this test's to change).
  const config = join(dir, "config.json");
  writeFileSync(config, JSON.stringify({ data_dir: join(dir, "data") }));
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("signs in with the operator token the banner names and opens the Runtime page", async () => {
    // As a user reads it: "console: URL (operators: … with the operator token in FILE)".
    const banner = /console: (\S+) \(operators: .* the operator token in (\S+)\)/.exec(
      server.stderr(),
    );
    expect(banner, server.stderr()).not.toBeNull();
    const [, consoleUrl, tokenFile] = banner!;
    const base = new URL(consoleUrl!).origin;
    const signIn = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: readFileSync(tokenFile!, "utf8").trim() }),
    });
    expect(signIn.status, await signIn.clone().text()).toBe(200);
    const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0]!;
    for (const page of ["approvals", "audit", "jobs", "benchmarks"]) {
      const r = await fetch(`${base}/console/api/${page}`, { headers: { cookie } });
      expect(r.status, `${page}: ${await r.clone().text()}`).toBe(200);
    }
    const runtime = await fetch(`${base}/console/api/runtime`, { headers: { cookie } });
    const body = await runtime.json();
    expect(runtime.status, JSON.stringify(body)).toBe(200);
    expect(body.error).toBeNull();
    expect(body.status.device.kind).toEqual(expect.any(String));
  });
});
