// Dependencies run one way, between the top-level rooms (server → tools → {policies, runtime} →
// lib, the dependency-free leaf)
// and between the rooms inside server/ (cli → doctor → transports → {console, mcp} → app →
// setup → stores → control → config → the leaf files at server/'s root). stores/ holds each store
// port's backends side by side: they implement the interfaces of policies/ and tools/, which never
// import them back. Every product file is walked
// (recursively); an import that runs back up, or across two sibling rooms, fails with its file
// and line. (console/src, bench/, scripts/ and test/ are aside: they may import any room, and no
// product file may import them.)
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { importSites } from "../helpers/imports.js";
import { ROOT } from "../helpers/server.js";

/** Top-level rooms and the rooms each may import. */
const TOP: Record<string, string[]> = {
  server: ["tools", "policies", "runtime", "lib"],
  tools: ["policies", "runtime", "lib"],
  policies: ["lib"],
  runtime: ["lib"],
  // The dependency-free leaf (device strings, dtypes, units): imports nothing of ours.
  lib: [],
};

/**
 * server/'s rooms, from the top: a room may import the rooms below it, never one above it nor a
 * sibling on its own level. "(root)" holds the leaf files at server/'s root (version.ts).
 */
const SERVER_LEVELS: string[][] = [
  ["cli"],
  ["doctor"],
  ["transports"],
  ["console", "mcp"],
  ["app"],
  ["setup"],
  // Each store port's backends (SQLite, Postgres, memory) and its contract suite; the composition
  // root (app/storage.ts) opens them, and they know nothing of the app.
  ["stores"],
  ["control"],
  ["config"],
  ["(root)"],
];

interface Edge {
  from: string;
  to: string;
  line: number;
}

function productFiles(room: string): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
      if (e.name === "node_modules" || e.name === "worker") continue; // the Python worker
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(ts|mts)$/.test(e.name) && !e.name.endsWith(".d.ts")) out.push(p);
    }
  };
  walk(room);
  return out;
}

/** Every relative import of a file (static, dynamic, re-export, any quote), as repository paths. */
function importsOf(file: string): Edge[] {
  const edges: Edge[] = [];
  for (const site of importSites(readFileSync(join(ROOT, file), "utf8"))) {
    // A computed specifier cannot be placed in a room: it is an edge to nowhere, refused below.
    if (site.spec === null)
      edges.push({ from: file, to: `(computed: ${site.text})`, line: site.line });
    else if (/^\.{1,2}\//.test(site.spec)) {
      const to = relative(ROOT, resolve(ROOT, dirname(file), site.spec)).replace(/\.js$/, ".ts");
      edges.push({ from: file, to, line: site.line });
    }
  }
  return edges;
}

const topRoom = (p: string) => p.split("/")[0]!;
function serverRoom(p: string): string {
  const parts = p.split("/");
  return parts.length > 2 ? parts[1]! : "(root)";
}
const level = (room: string) => SERVER_LEVELS.findIndex((l) => l.includes(room));

/** Why an import breaks the direction, or null when it is allowed. */
function violation(e: Edge): string | null {
  if (e.to.startsWith("(computed"))
    return "a computed import cannot be checked: import a literal path";
  const a = topRoom(e.from);
  const b = topRoom(e.to);
  if (a !== b) {
    return TOP[a]?.includes(b)
      ? null
      : `${a}/ may import only ${TOP[a]?.join(", ") || "nothing outside itself"}`;
  }
  if (a !== "server") return null;
  const ra = serverRoom(e.from);
  const rb = serverRoom(e.to);
  if (ra === rb) return null;
  const la = level(ra);
  const lb = level(rb);
  if (la < 0) return `server/${ra}/ is not in SERVER_LEVELS: place it in the order`;
  if (lb < 0) return `server/${rb}/ is not in SERVER_LEVELS: place it in the order`;
  if (lb < la) return `server/${ra}/ imports server/${rb}/, which sits above it`;
  if (lb === la) return `server/${ra}/ imports its sibling server/${rb}/`;
  return null;
}

const edges = Object.keys(TOP).flatMap((room) => productFiles(room).flatMap(importsOf));

describe("dependency direction", () => {
  it("walks every product room, folders included", () => {
    expect(edges.length).toBeGreaterThan(200);
    expect(edges.some((e) => e.from.startsWith("server/control/"))).toBe(true);
    expect(edges.some((e) => e.from.startsWith("runtime/pool/"))).toBe(true);
  });

  it("no import runs back up (between rooms, and inside server/)", () => {
    const bad = edges
      .map((e) => ({ e, why: violation(e) }))
      .filter((x) => x.why)
      .map(({ e, why }) => `${e.from}:${e.line} imports ${e.to}: ${why}`);
    expect(bad).toEqual([]);
  });

  it("the rule itself refuses an upward import, a sibling's and an unknown room", () => {
    const at = (from: string, to: string) => violation({ from, to, line: 1 });
    expect(at("server/config/config.ts", "server/app/app.ts")).toMatch(/above it/);
    expect(at("server/control/reload.ts", "server/cli/workers.ts")).toMatch(/above it/);
    expect(at("server/mcp/server.ts", "server/console/console.ts")).toMatch(/sibling/);
    expect(at("server/newroom/x.ts", "server/config/config.ts")).toMatch(/not in SERVER_LEVELS/);
    expect(at("server/stores/approvals/postgres.ts", "server/app/storage.ts")).toMatch(/above it/);
    expect(at("policies/gate/gate.ts", "server/stores/approvals/sqlite.ts")).toMatch(
      /policies\/ may import only lib/,
    );
    expect(at("tools/stores/jobs.ts", "server/stores/pg/pool.ts")).toMatch(
      /tools\/ may import only/,
    );
    expect(at("server/app/storage.ts", "server/stores/approvals/sqlite.ts")).toBeNull();
    expect(at("server/stores/approvals/sqlite.ts", "policies/approval_record.ts")).toBeNull();
    expect(at("tools/dispatch.ts", "server/app/app.ts")).toMatch(/tools\/ may import only/);
    expect(at("policies/gate.ts", "runtime/types.ts")).toMatch(/policies\/ may import only lib/);
    expect(at("lib/units.ts", "policies/estimate.ts")).toMatch(/nothing outside itself/);
    expect(at("runtime/client.ts", "test/helpers/server.ts")).toMatch(
      /runtime\/ may import only lib/,
    );
    expect(at("policies/estimate.ts", "lib/device.ts")).toBeNull();
    expect(at("server/cli/cli.ts", "server/version.ts")).toBeNull();
    expect(at("server/app/app.ts", "tools/registry.ts")).toBeNull();
  });

  it("reads every form of import: static, re-export, side effect, type, dynamic, any quote", () => {
    const src = [
      'import { a } from "./a.js";',
      "import type { B } from '../b.js';",
      'export * from "./c.js";',
      'import "./d.js";',
      "const e = await import(`../e.js`);",
      "const f = await import ( './f.js' );",
      'const g = require("./g.js");',
      "// a comment that says import(`./not-code.js`)",
      "const h = await import(`./${name}.js`);",
      "const i = await import(path);",
    ].join("\n");
    expect(importSites(src).map((s) => s.spec)).toEqual([
      "./a.js",
      "../b.js",
      "./c.js",
      "./d.js",
      "../e.js",
      "./f.js",
      "./g.js",
      null,
      null,
    ]);
    // A template-string import up the rooms is an edge like any other; a computed one is refused.
    const viaTemplate = importSites("await import(`../server/app/app.js`);")[0]!;
    expect(
      violation({ from: "tools/x.ts", to: `server/app/app.ts`, line: viaTemplate.line }),
    ).toMatch(/tools\/ may import only/);
    expect(violation({ from: "tools/x.ts", to: "(computed: import(p))", line: 1 })).toMatch(
      /computed import/,
    );
  });

  it("no product file imports console/src, bench/, scripts/ or test/", () => {
    const aside = edges.filter((e) => /^(console|bench|scripts|test)\//.test(e.to));
    expect(aside.map((e) => `${e.from}:${e.line} imports ${e.to}`)).toEqual([]);
  });
});
