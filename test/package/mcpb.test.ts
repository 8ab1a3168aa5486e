// The Claude Desktop extension: scripts/mcpb.ts stages the bundle (manifest.json + the npm
// package with its production node_modules), the official CLI (@anthropic-ai/mcpb) validates and
// packs it; a broken manifest fails validation; and the packed bundle, unpacked by the same CLI
// and started the way the manifest says (its mcp_config, user_config left empty, a fresh HOME, a
// bare PATH), serves MCP over stdio. The Python side is the checkout's .venv (TPU_MCP_VENV, as in
// package.test.ts); the background set-up that start begins is stopped at the end.
import { execFileSync, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mcpbCli, packBundle, stageBundle } from "../../scripts/mcpb.js";
import { ROOT, errorOf } from "../helpers/server.js";
import { call } from "../e2e/scenario.js";
import { stopBackgroundSetup } from "./background.js";
import { scaled } from "../helpers/calibrate.js";

const work = mkdtempSync(join(tmpdir(), "tpu-mcp-mcpb-test-"));
const home = join(work, "home");
let staged: string;
let bundle: string;

function mcpb(...args: string[]) {
  const [cmd, ...pre] = mcpbCli();
  const r = spawnSync(cmd, [...pre, ...args], { encoding: "utf8" });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

beforeAll(() => {
  mkdirSync(home);
  staged = stageBundle(join(work, "staged"));
  bundle = packBundle(staged, work);
}, scaled(900_000));

afterAll(async () => {
  await stopBackgroundSetup(join(home, ".local", "share", "tpu-mcp"));
  rmSync(work, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
});

describe("the .mcpb bundle", () => {
  it("passes `mcpb validate`", () => {
    const r = mcpb("validate", join(staged, "manifest.json"));
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/validation passes/);
  });

  it("fails `mcpb validate` when one field breaks", () => {
    const manifest = JSON.parse(readFileSync(join(staged, "manifest.json"), "utf8"));
    for (const [what, breakIt] of [
      ["a server type the spec does not know", (m: any) => (m.server.type = "ruby")],
      ["a user_config entry without a title", (m: any) => delete m.user_config.data_dir.title],
      ["no version", (m: any) => delete m.version],
    ] as const) {
      const broken = structuredClone(manifest);
      breakIt(broken);
      const file = join(work, "broken.json");
      writeFileSync(file, JSON.stringify(broken));
      expect(mcpb("validate", file).code, what).not.toBe(0);
    }
  });

  it(
    "unpacks and starts the server over stdio as its manifest says",
    { timeout: scaled(120_000) },
    async () => {
      const out = join(work, "unpacked");
      const r = mcpb("unpack", bundle, out);
      expect(r.code, r.out).toBe(0);
      const manifest = JSON.parse(readFileSync(join(out, "manifest.json"), "utf8"));
      const cfg = manifest.server.mcp_config;
      // What the host does: ${__dirname} is the bundle, unset user_config values are empty.
      const sub = (s: string) =>
        s.replace("${__dirname}", out).replace(/\$\{user_config\.\w+\}/g, "");
      const env: Record<string, string> = {
        HOME: home,
        PATH: "/usr/bin:/bin",
        TPU_MCP_VENV: join(ROOT, ".venv"),
        ...Object.fromEntries(
          Object.entries(cfg.env as Record<string, string>).map(([k, v]) => [k, sub(v)]),
        ),
      };
      const client = new Client({ name: "mcpb-test", version: "0" });
      const transport = new StdioClientTransport({
        command: cfg.command,
        args: cfg.args.map(sub),
        env,
        cwd: home,
        stderr: "pipe",
      });
      let stderr = "";
      transport.stderr?.on("data", (d) => (stderr += d));
      await client.connect(transport);
      try {
        expect(client.getServerVersion()?.version).toBe(manifest.version);
        const tools = await client.listTools();
        expect(tools.tools.map((t) => t.name).sort()).toEqual(
          manifest.tools.map((t: { name: string }) => t.name).sort(),
        );
        const load = await call(client as any, "load_model", { model: "smollm2-135m-instruct" });
        expect(errorOf(load)?.code, JSON.stringify(load.content)).toBe("runtime_setting_up");
      } finally {
        await client.close();
      }
      expect(stderr).not.toMatch(/\n\s+at .+\(.+:\d+:\d+\)/);
      // The bundle carries no build tools and no TypeScript loader.
      const listed = execFileSync("ls", [join(out, "server", "node_modules")], {
        encoding: "utf8",
      });
      expect(listed.split("\n")).not.toContain("tsx");
    },
  );
});
