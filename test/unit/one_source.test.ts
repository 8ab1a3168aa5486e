// One source for each fact (issue 45): the device kinds (lib/device.ts), the stdio principal's
// default scopes (policies/scopes.ts) and the MCP App views' URIs (lib/views.ts) are each written
// once. Every product file is read; a second list of kinds or scopes, or a view URI written out as
// a literal, fails with its file and line. The patterns come from the definitions themselves, so
// a kind or scope added later is covered too.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { DEVICE_KINDS } from "../../lib/device.js";
import { APPROVAL_CARD_URI, BENCHMARK_VIEW_URI } from "../../lib/views.js";
import { DEFAULT_STDIO_SCOPES, SCOPES } from "../../policies/scopes.js";
import { RESERVED_NAMES, chipEnv } from "../../runtime/pool/entries.js";
import { parseInventory } from "../../runtime/pool/inventory.js";
import { device } from "../../tools/schemas.js";
import { ServerConfigSchema } from "../../server/config/config.js";
import { RaySchema } from "../../server/config/ray.js";
import { ROOT } from "../helpers/server.js";

const ROOMS = ["server", "tools", "policies", "runtime", "lib"];

function productFiles(): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
      if (e.name === "node_modules" || e.name === "worker") continue; // the Python worker
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(ts|mts)$/.test(e.name) && !e.name.endsWith(".d.ts")) out.push(p);
    }
  };
  for (const room of ROOMS) walk(room);
  return out;
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
const anyOf = (words: readonly string[]) => `(?:${words.map(escape).join("|")})`;

/**
 * A list of two or more names: quoted and joined by `,` or `|` (an array, a z.enum, a union
 * type), or, for device kinds, unquoted in a regex alternation (`tpu|cuda`).
 */
function listPattern(words: readonly string[], alternation: boolean): RegExp {
  const w = anyOf(words);
  const quoted = `(["'\`])${w}\\1\\s*[,|]\\s*(["'\`])${w}\\2`;
  return new RegExp(alternation ? `${quoted}|\\b${w}\\|${w}\\b` : quoted);
}

interface Rule {
  fact: string;
  home: string;
  pattern: RegExp;
}

const RULES: Rule[] = [
  { fact: "a device-kind list", home: "lib/device.ts", pattern: listPattern(DEVICE_KINDS, true) },
  { fact: "a scope list", home: "policies/scopes.ts", pattern: listPattern(SCOPES, false) },
  ...[BENCHMARK_VIEW_URI, APPROVAL_CARD_URI].map((uri) => ({
    fact: `the view URI ${uri}`,
    home: "lib/views.ts",
    pattern: new RegExp(`(["'\`])${escape(uri)}\\1`),
  })),
];

/** Each line of `text` that restates a rule's fact outside its home, as `file:line: fact`. */
function restatements(file: string, text: string): string[] {
  const out: string[] = [];
  text.split("\n").forEach((line, i) => {
    for (const r of RULES)
      if (file !== r.home && r.pattern.test(line)) out.push(`${file}:${i + 1}: ${r.fact}`);
  });
  return out;
}

const FILES = productFiles();

describe("one source for each fact", () => {
  it("reads every product room", () => {
    expect(FILES.length).toBeGreaterThan(150);
    for (const room of ROOMS)
      expect(
        FILES.some((f) => f.startsWith(`${room}/`)),
        room,
      ).toBe(true);
    for (const r of RULES) expect(FILES, r.home).toContain(r.home);
  });

  it("no product file restates the device kinds, the scopes or a view URI", () => {
    const bad = FILES.flatMap((f) => restatements(f, readFileSync(join(ROOT, f), "utf8")));
    expect(bad).toEqual([]);
  });

  it("the rule catches each form a second list took, and leaves prose and single names alone", () => {
    const caught = [
      String.raw`const RESERVED = /^(auto|cpu|cuda|tpu|xla)(:\d+)?$/;`,
      String.raw`const m = /^(tpu|cuda):(\d+)$/.exec(device);`,
      `  kind: "tpu" | "cuda" | "xla" | "cpu";`,
      `  kind: z.enum(["tpu", "xla", "cuda", "cpu"]),`,
      `const PRICED = ['cpu', 'cuda'] as const;`,
      `export const DEFAULT = ["models:read", "models:load"] as const;`,
      `ui: { resourceUri: "${BENCHMARK_VIEW_URI}" },`,
      `meta = { resourceUri: '${APPROVAL_CARD_URI}' };`,
    ];
    for (const line of caught) expect(restatements("tools/x.ts", line), line).toHaveLength(1);
    const left = [
      `.describe("tpu, tpu:0, cuda:1, cpu or a pool worker");`,
      `/** Target device ("tpu", "cuda:1", "cpu"); device-bound tools take its lane. */`,
      `if ((inv.kind === "tpu" || inv.kind === "cuda") && inv.count > 1) {`,
      `"use auto, cpu, cuda, tpu or xla, optionally with :index",`,
      `scope: "models:load",`,
      `// The MCP App view (ui://tpu-mcp/benchmark-view.html): one document`,
    ];
    for (const line of left) expect(restatements("tools/x.ts", line), line).toEqual([]);
    // In its home a definition is no restatement.
    expect(restatements("lib/device.ts", `export const DEVICE_KINDS = ["cpu", "cuda"];`)).toEqual(
      [],
    );
  });

  it("the stdio default is the scopes' first part, the operator's scopes after it", () => {
    expect(SCOPES.slice(0, DEFAULT_STDIO_SCOPES.length)).toEqual([...DEFAULT_STDIO_SCOPES]);
    expect(DEFAULT_STDIO_SCOPES).not.toContain("admin");
    expect(DEFAULT_STDIO_SCOPES).not.toContain("approvals:grant");
  });

  it("every derived pattern and schema takes each kind, and still refuses another", () => {
    const local = (d: string) =>
      ServerConfigSchema.safeParse({ runtime: { workers: [{ name: "w0", device: d }] } }).success;
    for (const k of DEVICE_KINDS) {
      expect(RESERVED_NAMES.test(k) && RESERVED_NAMES.test(`${k}:3`), k).toBe(true);
      expect(device.safeParse(`${k}:0`).success, k).toBe(true);
      expect(local(`${k}:1`), k).toBe(true);
      expect(parseInventory(JSON.stringify({ kind: k, count: 1 })).kind).toBe(k);
    }
    expect(RESERVED_NAMES.test("npu:0")).toBe(false);
    expect(device.safeParse("npu:0").success).toBe(false);
    expect(local("npu:1")).toBe(false);
    expect(() => parseInventory(JSON.stringify({ kind: "npu", count: 1 }))).toThrow(/unexpected/);
    // A Ray actor takes every kind but xla, as the fleet driver does (tpu_worker/fleet/config.py).
    const actor = (d: string) =>
      RaySchema.safeParse({
        address: "10.0.0.2:6379",
        token_file: "/t",
        actor: { catalog: "/c.json", device: d },
        channel: { client_ca: "/ca.crt", token_file: "/wt" },
        client: { cert: "/c.crt", key: "/c.key" },
      }).success;
    expect(actor("auto")).toBe(true);
    for (const k of DEVICE_KINDS) expect(actor(k), k).toBe(k !== "xla");
    // A chip of a kind without a visible-devices variable, or a key of Object's prototype, keeps the environment.
    const base = { PATH: "/bin" };
    expect(chipEnv("tpu:2", base).TPU_VISIBLE_DEVICES).toBe("2");
    expect(chipEnv("cuda:1", base).CUDA_VISIBLE_DEVICES).toBe("1");
    for (const d of ["xla:0", "cpu:0", "constructor:1", "npu:0"])
      expect(chipEnv(d, base), d).toBe(base);
  });
});
