// The 45 s soft deadline is a default operators rely on (a job tool still running after it answers
// with a job_id): pinned here as the resolved config and as the value the MCP server hands to
// dispatch, without timing anything.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, describe, expect, it, vi } from "vitest";
import { parsePolicyConfig } from "../../policies/config.js";
import { createApp, type App } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { createMcpServer } from "../../server/mcp/server.js";
import type { DispatchInput } from "../../tools/dispatch/dispatch.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { ROOT } from "../helpers/server.js";

const handed = vi.hoisted(() => [] as Array<{ tool: string; softDeadlineS: number | undefined }>);
vi.mock("../../tools/dispatch/dispatch.js", async (importOriginal) => ({
  ...(await importOriginal<typeof import("../../tools/dispatch/dispatch.js")>()),
  // Records what the server hands over and answers at once: no worker, no clock.
  dispatchTool: async (input: DispatchInput) => {
    handed.push({ tool: input.tool.name, softDeadlineS: input.softDeadlineS });
    return {
      kind: "error",
      code: "internal",
      result: { content: [{ type: "text", text: "recorded" }], isError: true },
    };
  },
}));

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-soft-deadline-"));
const apps: App[] = [];
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
  rmSync(dir, { recursive: true, force: true });
});

async function callThrough(config: Record<string, unknown>, name: string) {
  const app = await createApp(
    parseConfig(
      { data_dir: join(dir, `data-${apps.length}`), runtime: { start: "lazy" }, ...config },
      { root: ROOT },
    ),
    pino({ level: "silent" }),
  );
  apps.push(app);
  const server = createMcpServer(app, { id: "admin", scopes: ["admin"], via: "stdio" });
  const [ct, st] = InMemoryTransport.createLinkedPair();
  await server.connect(st);
  const client = new Client({ name: "soft-deadline", version: "0" });
  await client.connect(ct);
  try {
    await client.callTool({ name, arguments: { model: "mnist-cnn" } });
  } finally {
    await client.close();
  }
  return { app, handed: handed.splice(0) };
}

describe("the soft deadline's default", () => {
  it("is 45 s in the policy schema and in a config that does not set it", () => {
    expect(parsePolicyConfig({}, TOOL_POLICIES).limits.soft_deadline_s).toBe(45);
    const cfg = parseConfig({ data_dir: join(dir, "cfg") }, { root: ROOT });
    expect(cfg.policy.limits.soft_deadline_s).toBe(45);
  });

  it("is what the MCP server hands to dispatch for a job tool, unless the config sets another", async () => {
    const dflt = await callThrough({}, "load_model");
    expect(dflt.handed).toEqual([{ tool: "load_model", softDeadlineS: 45 }]);
    const set = await callThrough({ policy: { limits: { soft_deadline_s: 7 } } }, "load_model");
    expect(set.handed).toEqual([{ tool: "load_model", softDeadlineS: 7 }]);
  });
});
