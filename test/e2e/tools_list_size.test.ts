// An agent reads tools/list in every conversation: the demo agent's list stays within 12 KB
// (about 3,000 tokens at 4 bytes a token) in both protocol eras, measured as the server sends it
// to the SDK's real clients over HTTP (the 2026-07-28 result adds its `_meta`, `ttlMs` and
// `cacheScope`); every tool description and the server instructions stay within 2 KB, where
// Claude Code cuts them; and get_runtime_status publishes pool and fleet fields only where the
// deployment has them (the server still checks every answer against the full schema).
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readCatalog } from "../../runtime/catalog.js";
import { jsonSchema } from "../../server/mcp/json_schema.js";
import { buildTools } from "../../tools/registry.js";
import type { Deployment, ToolEnv } from "../../tools/types.js";
import { connectModernHttp } from "../helpers/modern.js";
import {
  DEMO_POLICY,
  DEMO_TOKENS,
  ROOT,
  connectHttp,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { wireSize } from "../helpers/wire.js";

/** Issue 44's goal: 12 KB, the JSON of the tools/list result as sent, in either era. */
const AGENT_LIST_MAX_BYTES = 12_288;
/** Claude Code cuts a tool description or the server instructions past 2 KB. */
const TEXT_MAX_BYTES = 2_048;

const utf8 = (s: string | undefined) => Buffer.byteLength(s ?? "");

/** One era's client of the demo server: its tools/list (value and bytes) and the instructions. */
type Lister = (token: string) => Promise<{
  tools: { name: string; description?: string; inputSchema: unknown }[];
  bytes: number;
  instructions: string | undefined;
}>;

function listerFor(url: () => string, era: "2025-11-25" | "2026-07-28"): Lister {
  return async (token) => {
    const c =
      era === "2025-11-25"
        ? await connectHttp(url(), token)
        : await connectModernHttp(url(), token, { mode: "pin" });
    try {
      // wireSize reads the transport's messages, the same in both SDK clients.
      const { value, bytes } = await wireSize(c.client as any, (): Promise<{ tools: any[] }> =>
        c.client.listTools(),
      );
      return { tools: value.tools, bytes, instructions: c.client.getInstructions() };
    } finally {
      await c.close();
    }
  };
}

const mentions = (schema: unknown, field: string) =>
  new RegExp(`\\b${field}\\b`).test(JSON.stringify(schema));

describe("the demo agent's tools/list (real server, SDK client over HTTP)", () => {
  let server: HttpServerProc;
  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-toolsize-"));
    // Lazy: listing tools never starts a worker.
    const config = writeConfig(
      {
        policy: DEMO_POLICY,
        runtime: {
          python: join(ROOT, ".venv/bin/python"),
          catalog: join(ROOT, "runtime/catalog.builtin.json"),
          device: "cpu",
          start: "lazy",
        },
      },
      dir,
    );
    server = await startHttpServer(config);
  });
  afterAll(async () => {
    await server?.stop();
  });

  describe.each(["2025-11-25", "2026-07-28"] as const)("in the %s era", (era) => {
    const list = listerFor(() => server.url, era);

    it(`stays at most ${AGENT_LIST_MAX_BYTES} bytes with all nine tools`, async () => {
      const { tools, bytes } = await list(DEMO_TOKENS.agent);
      expect(tools).toHaveLength(9);
      expect(bytes, `tools/list is ${bytes} bytes`).toBeLessThanOrEqual(AGENT_LIST_MAX_BYTES);
      // Still described for a model: when to use each tool, and the inputs' bounds.
      for (const t of tools) expect(t.description, t.name).toMatch(/^Use /);
      const bench = tools.find((t) => t.name === "run_benchmark")!.inputSchema as any;
      expect(bench.properties.batch_sizes).toMatchObject({ maxItems: 8, items: { minimum: 1 } });
      expect(bench.properties.model.enum).toContain("mnist-cnn");
      // The reader sees fewer tools, so fewer bytes.
      expect((await list(DEMO_TOKENS.reader)).bytes).toBeLessThan(bytes);
    });

    it(`keeps every tool description and the instructions within ${TEXT_MAX_BYTES} bytes`, async () => {
      const { tools, instructions } = await list(DEMO_TOKENS.agent);
      expect(utf8(instructions), "instructions are published").toBeGreaterThan(0);
      expect(utf8(instructions), "instructions").toBeLessThanOrEqual(TEXT_MAX_BYTES);
      for (const t of tools)
        expect(utf8(t.description), t.name).toBeLessThanOrEqual(TEXT_MAX_BYTES);
    });
  });

  it("publishes get_runtime_status without pool or fleet fields on a single worker", async () => {
    const agent = await connectHttp(server.url, DEMO_TOKENS.agent);
    try {
      const { tools } = await agent.client.listTools();
      const status = tools.find((t) => t.name === "get_runtime_status")!;
      expect(mentions(status.outputSchema, "workers")).toBe(false);
      expect(mentions(status.outputSchema, "fleet")).toBe(false);
      // What is published is still checked by the SDK client: a real call validates against it.
      const st: any = await agent.client.callTool({ name: "get_runtime_status", arguments: {} });
      expect(st.isError).toBeFalsy();
      expect(st.structuredContent.jobs_running).toBe(0);
    } finally {
      await agent.close();
    }
  });
});

describe("get_runtime_status's published schema follows the deployment", () => {
  const env = (deployment: Deployment): ToolEnv => ({
    catalog: readCatalog(join(ROOT, "runtime/catalog.builtin.json")),
    limits: {
      max_texts: 64,
      inline_max_elements: 4096,
      max_tensor_elements: 1 << 20,
      benchmark: { max_configs: 64, max_iterations: 10_000, max_duration_s: 600, max_warmup: 100 },
    },
    deployment,
  });
  const published = (d: Deployment) => {
    const t = buildTools(env(d)).find((x) => x.name === "get_runtime_status")!;
    return { schema: jsonSchema(t.listedOutput ?? t.output, "output"), tool: t };
  };

  it.each([
    [{ pool: false, fleet: false }, false, false],
    [{ pool: true, fleet: false }, true, false],
    [{ pool: true, fleet: true }, true, true],
  ] as const)("%j: workers %s, fleet %s", (d, workers, fleet) => {
    const { schema, tool } = published(d);
    expect(mentions(schema, "workers")).toBe(workers);
    expect(mentions(schema, "fleet")).toBe(fleet);
    // The server checks answers against the full schema whatever it publishes.
    const shape = (tool.output as any).shape;
    expect(Object.keys(shape)).toEqual(expect.arrayContaining(["workers", "fleet"]));
  });
});
