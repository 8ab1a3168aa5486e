// Every tool's input and output schema, exactly as tools/list publishes them, must compile under
// ajv's strict mode (JSON Schema 2020-12, the MCP default dialect) without a single warning, so
// strict validators (the Inspector's strict mode, typed clients) accept them; and counts are
// `integer`, so typed clients (fastmcp) do not turn them into 1.0.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { Ajv2020 } from "ajv/dist/2020.js";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createApp, type App } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { createMcpServer } from "../../server/mcp/server.js";
import { ROOT } from "../helpers/server.js";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-schemas-"));
let app: App;
let client: Client;
let tools: Awaited<ReturnType<Client["listTools"]>>["tools"];

beforeAll(async () => {
  // Lazy runtime: listing tools never starts a worker.
  app = await createApp(
    parseConfig({ data_dir: join(dir, "data"), runtime: { start: "lazy" } }, { root: ROOT }),
    pino({ level: "silent" }),
  );
  const server = createMcpServer(app, { id: "admin", scopes: ["admin"], via: "stdio" });
  const [ct, st] = InMemoryTransport.createLinkedPair();
  await server.connect(st);
  client = new Client({ name: "strict", version: "0" });
  await client.connect(ct);
  tools = (await client.listTools()).tools;
});
afterAll(async () => {
  await client?.close();
  await app?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Compiles a schema with ajv in strict mode; returns every warning and error it reports. */
function strictProblems(schema: unknown): string[] {
  const problems: string[] = [];
  const logger = {
    log: () => {},
    warn: (...a: unknown[]) => problems.push(`warn: ${a.map(String).join(" ")}`),
    error: (...a: unknown[]) => problems.push(`error: ${a.map(String).join(" ")}`),
  };
  const ajv = new Ajv2020({ strict: true, allErrors: true, logger });
  try {
    ajv.compile(schema as object);
  } catch (e) {
    problems.push(`throws: ${(e as Error).message}`);
  }
  return problems;
}

/** Keywords that constrain a value; a schema with none of them accepts anything. */
const CONSTRAINING = new Set(
  (
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength " +
    "minLength pattern format maxItems minItems uniqueItems maxContains minContains " +
    "maxProperties minProperties required dependentRequired allOf anyOf oneOf not if then else " +
    "items prefixItems contains additionalItems unevaluatedItems properties patternProperties " +
    "additionalProperties unevaluatedProperties propertyNames dependentSchemas $ref"
  ).split(" "),
);
/** Keywords where `true`/`false` is the ordinary spelling ("anything else" / "nothing else"). */
const BOOLEAN_OK = new Set([
  "additionalProperties",
  "unevaluatedProperties",
  "additionalItems",
  "unevaluatedItems",
]);

/**
 * Constructs that are legal JSON Schema but that MCP clients read unevenly (what the
 * Inspector's strict mode warns about): `type` arrays (nullable unions), schemas that constrain
 * nothing (`{}`, e.g. a bare `additionalProperties: {}`), bare booleans where a schema object
 * is expected, references outside the document, and a non-object input root.
 */
function portabilityProblems(schema: unknown, kind: "input" | "output"): string[] {
  const out: string[] = [];
  if (kind === "input" && (schema as any)?.type !== "object")
    out.push("$: input root is not an object");
  const walk = (node: unknown, path: string, keyword?: string, depth = 0): void => {
    if (depth > 64) return;
    if (typeof node === "boolean") {
      if (!keyword || !BOOLEAN_OK.has(keyword)) out.push(`${path}: bare ${node} as a schema`);
      return;
    }
    if (!node || typeof node !== "object" || Array.isArray(node)) return;
    const n = node as Record<string, any>;
    if (Array.isArray(n.type)) out.push(`${path}: type is an array ${JSON.stringify(n.type)}`);
    if (typeof n.$ref === "string" && !n.$ref.startsWith("#")) out.push(`${path}: remote $ref`);
    if (!Object.keys(n).some((k) => CONSTRAINING.has(k)))
      out.push(`${path}: constrains nothing (${JSON.stringify(n).slice(0, 60)})`);
    for (const k of ["properties", "patternProperties", "$defs", "dependentSchemas"])
      for (const [name, sub] of Object.entries(n[k] ?? {}))
        walk(sub, `${path}.${k}.${name}`, k, depth + 1);
    for (const k of ["allOf", "anyOf", "oneOf", "prefixItems"])
      (n[k] ?? []).forEach((sub: unknown, i: number) =>
        walk(sub, `${path}.${k}[${i}]`, k, depth + 1),
      );
    for (const k of [
      "items",
      "contains",
      "not",
      "propertyNames",
      "if",
      "then",
      "else",
      "additionalProperties",
      "unevaluatedProperties",
      "additionalItems",
      "unevaluatedItems",
    ])
      if (k in n) walk(n[k], `${path}.${k}`, k, depth + 1);
  };
  walk(schema, "$");
  return out;
}

/** Property paths whose schema is `number` although the value is a count. */
function nonIntegerCounts(schema: any, path = "$"): string[] {
  if (!schema || typeof schema !== "object") return [];
  const out: string[] = [];
  const name = path.split(".").pop() ?? "";
  const isCount =
    /(^|_)(count|batch|bytes|items|elements|ops|restarts|in_flight|queue_depth|jobs_running|iterations|index|pid|parameters|unmatched|on_device|fell_back|failed|seq_len|max_[a-z_]+|graphs_compiled|recompiles_in_window)$/.test(
      name,
    );
  const types = [schema.type, ...(schema.anyOf ?? []).map((s: any) => s.type)].flat();
  if (isCount && types.includes("number")) out.push(path);
  for (const [k, v] of Object.entries(schema.properties ?? {}))
    out.push(...nonIntegerCounts(v, `${path}.${k}`));
  if (schema.items) out.push(...nonIntegerCounts(schema.items, `${path}[]`));
  for (const s of schema.anyOf ?? []) out.push(...nonIntegerCounts(s, path));
  return out;
}

describe("published tool schemas", () => {
  it("lists all nine tools", () => {
    expect(tools.map((t) => t.name).sort()).toEqual([
      "cancel_job",
      "check_model",
      "get_job",
      "get_runtime_status",
      "list_models",
      "load_model",
      "run_benchmark",
      "run_inference",
      "unload_model",
    ]);
  });

  it("compile under ajv strict mode with no warning (input and output)", () => {
    const problems = tools.flatMap((t) => [
      ...strictProblems(t.inputSchema).map((p) => `${t.name} input: ${p}`),
      ...(t.outputSchema ? strictProblems(t.outputSchema) : ["no outputSchema"]).map(
        (p) => `${t.name} output: ${p}`,
      ),
    ]);
    expect(problems).toEqual([]);
  });

  it("use only constructs every MCP client reads alike (no type arrays, no bare {})", () => {
    const problems = tools.flatMap((t) => [
      ...portabilityProblems(t.inputSchema, "input").map((p) => `${t.name} input ${p}`),
      ...portabilityProblems(t.outputSchema, "output").map((p) => `${t.name} output ${p}`),
    ]);
    expect(problems).toEqual([]);
  });

  it("type counts as integer in every output schema", () => {
    const loose = tools.flatMap((t) =>
      nonIntegerCounts(t.outputSchema).map((p) => `${t.name} ${p}`),
    );
    expect(loose).toEqual([]);
    // Spot checks that the walk does look where counts are.
    const check = tools.find((t) => t.name === "check_model")!.outputSchema as any;
    // Nested objects are published as documented objects (server/mcp/json_schema.ts): the
    // counts a client can validate are the top-level ones.
    expect(check.properties.total_ops.type).toBe("integer");
    const status = tools.find((t) => t.name === "get_runtime_status")!.outputSchema as any;
    expect(status.properties.jobs_running.type).toBe("integer");
  });
});
