// The maps of the repository (issue 45): server/README.md, the layout block of
// docs/development.md and docs/where-to-add.md. Every path they name must be a tracked file or
// folder, and the maps must name every folder they claim to cover, so a file moved, renamed or
// added without its map fails here with the document, the line and the path. The product code's
// comments are held to the same: a file they cite must exist.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join, normalize } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT } from "../helpers/server.js";

/** Each map, and the folder its bare and relative names are looked up under ("" = anywhere). */
const MAPS = [
  { file: "server/README.md", scope: "server" },
  { file: "docs/development.md", scope: "" },
  { file: "docs/where-to-add.md", scope: "" },
];

const EXTENSIONS = /\.(ts|mts|mjs|js|py|md|json|jsonl|txt|toml|sh|css|html|svg|png|yaml|yml)$/;
// MCP method names (`tools/list`, `notifications/progress`) look like paths but are not.
const MCP_METHOD = /^(tools|resources|prompts|notifications|completion|logging)\/[a-z_]+$/;

const TRACKED: string[] = execFileSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" })
  .split("\0")
  .filter(Boolean);
const FOLDERS = new Set(
  TRACKED.flatMap((f) =>
    f
      .split("/")
      .slice(0, -1)
      .map((_, i, a) => a.slice(0, i + 1).join("/")),
  ),
);
const PATHS = new Set([...TRACKED, ...FOLDERS]);

interface Named {
  line: number;
  path: string;
  /** Where a bare or relative name is looked up: the map's scope, or a layout line's folder. */
  scope: string;
}

/** Whether a name in `doc` is a tracked path: from the root, from the doc's folder, or under scope. */
function resolves(doc: string, n: Named): boolean {
  const p = n.path.replace(/\/$/, "");
  if (PATHS.has(normalize(p)) || PATHS.has(normalize(join(dirname(doc), p)))) return true;
  const under = n.scope ? `${n.scope}/` : "";
  for (const t of PATHS)
    if (t.startsWith(under) && (t === under + p || t.endsWith(`/${p}`))) return true;
  return false;
}

/** A token that names a path: a folder (`x/`), a file with a known extension, or `a/b`. */
function pathLike(token: string): boolean {
  if (/[<>*{}$…:]/.test(token) || /^(@|\/|#|https?:|-)/.test(token)) return false;
  if (token.startsWith("dist/")) return false; // build outputs, absent from a clone
  if (MCP_METHOD.test(token)) return false;
  return token.endsWith("/") || EXTENSIONS.test(token) || token.includes("/");
}

function isFence(line: string): boolean {
  return line.startsWith("```");
}

/** The layout block of docs/development.md: the fenced block under `## Layout`, with its lines. */
function layoutBlock(md: string): { line: number; text: string }[] {
  const lines = md.split("\n");
  const at = lines.indexOf("## Layout");
  const open = lines.findIndex((l, i) => i > at && isFence(l));
  const close = lines.findIndex((l, i) => i > open && isFence(l));
  if (at < 0 || open < 0 || close < 0) throw new Error("docs/development.md has no layout block");
  return lines.slice(open + 1, close).map((text, i) => ({ line: open + 2 + i, text }));
}

/**
 * Every path a layout line names, looked up under its room: the folder a line starts with, or
 * one after two spaces (`examples/  the demo policy;  docs/  the chart`), until the next room.
 */
function layoutNames(block: { line: number; text: string }[]): Named[] {
  const out: Named[] = [];
  let room = "";
  for (const { line, text } of block) {
    const rooms = [...text.matchAll(/(?:^|;\s+)(\.?[\w-]+)\/ {2,}/g)].map((m) => ({
      at: m.index,
      room: m[1],
    }));
    for (const m of text.matchAll(/(?:^|[\s(,;`])(\.?[\w.-]+(?:\/[\w.-]+)*\/?)/g)) {
      for (const r of rooms) if (r.at <= m.index) room = r.room;
      const token = m[1].replace(/[.,;:]+$/, "");
      if (pathLike(token)) out.push({ line, path: token, scope: room });
    }
  }
  return out;
}

/** Every path an inline code span names, outside fenced blocks. */
function inlineNames(md: string, scope: string): Named[] {
  const out: Named[] = [];
  let fenced = false;
  md.split("\n").forEach((text, i) => {
    if (isFence(text)) fenced = !fenced;
    if (fenced || isFence(text)) return;
    for (const span of text.matchAll(/`([^`]+)`/g))
      for (const raw of span[1].split(/\s+/)) {
        const token = raw.replace(/^[("']+|[)"',;:]+$/g, "");
        if (token && pathLike(token)) out.push({ line: i + 1, path: token, scope });
      }
  });
  return out;
}

function namesOf(file: string, scope: string): Named[] {
  const md = readFileSync(join(ROOT, file), "utf8");
  return file === "docs/development.md"
    ? [...inlineNames(md, scope), ...layoutNames(layoutBlock(md))]
    : inlineNames(md, scope);
}

/** The tracked folders directly inside `parent`. */
function childFolders(parent: string): string[] {
  return [...FOLDERS]
    .filter((f) => dirname(f) === parent)
    .map((f) => (parent === "." ? f : f.slice(parent.length + 1)));
}

describe("the repository's maps name only paths that exist", () => {
  for (const { file, scope } of MAPS) {
    it(`${file}: every path it names is a tracked file or folder`, () => {
      const names = namesOf(file, scope);
      expect(names.length, `${file} names no paths: the parser is broken`).toBeGreaterThan(10);
      const missing = names
        .filter((n) => !resolves(file, n))
        .map(
          (n) =>
            `${file}:${n.line}: ${n.path} (looked up from the root and under ${n.scope || "the whole tree"})`,
        );
      expect(missing, "rename the path to where the file is now, or drop it").toEqual([]);
    });
  }
});

describe("the repository's maps name every folder they cover", () => {
  it("server/README.md has a row for every folder of server/", () => {
    const md = readFileSync(join(ROOT, "server/README.md"), "utf8");
    const rows = new Set(
      [...md.matchAll(/^\| ([^|]+)\|/gm)].flatMap((m) =>
        [...m[1].matchAll(/`([\w.-]+)\/`/g)].map((c) => c[1]),
      ),
    );
    const left = childFolders("server").filter((d) => !rows.has(d));
    expect(left, "add a row for each to server/README.md's table").toEqual([]);
  });

  it("docs/development.md's layout block names every top-level folder and the rooms' folders", () => {
    const block = layoutBlock(readFileSync(join(ROOT, "docs/development.md"), "utf8"));
    const text = block.map((l) => l.text).join("\n");
    const named = (folder: string) =>
      new RegExp(`(^|[\\s(,;])${folder.replace(/\./g, "\\.")}/`, "m").test(text);
    const covered = [
      "server",
      "tools",
      "policies",
      "runtime",
      "runtime/worker",
      "runtime/worker/tpu_worker",
      "test",
    ];
    const left = [
      ...childFolders(".").filter((d) => !named(d)),
      ...covered.flatMap((p) =>
        childFolders(p)
          .filter((d) => !named(d))
          .map((d) => `${p}/${d}`),
      ),
    ];
    expect(left, "name each in the layout block of docs/development.md").toEqual([]);
  });
});

/** The product rooms whose comments are checked; build outputs (dist/) are not in a clone. */
const PRODUCT = /^(server|tools|policies|runtime|lib|console\/src)\/.*\.(ts|py)$/;
const CODE_PATH =
  /(?:^|[\s(,;`'"])((?:\.{1,2}\/)?[\w-][\w.-]*(?:\/[\w.-]+)+\.(?:ts|mts|mjs|py|md|json|sh))\b/g;

/**
 * The comment lines of a TypeScript or Python file. Python: `#` lines and docstrings (a block
 * that opens at the start of a line), not other triple-quoted strings (a script's text).
 */
function commentLines(file: string, src: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let open: "doc" | "string" | null = null;
  src.split("\n").forEach((text, i) => {
    const t = text.trim();
    if (!file.endsWith(".py")) {
      if (/^(\/\/|\/?\*)/.test(t) || text.includes(" // ")) out.push({ line: i + 1, text });
      return;
    }
    const toggles = (text.match(/"""/g) ?? []).length % 2 === 1;
    const kind = open ?? (/^r?"""/.test(t) ? "doc" : "string");
    if (kind === "doc" && (open || /^r?"""/.test(t))) out.push({ line: i + 1, text });
    else if (t.startsWith("#") || text.includes(" # ")) out.push({ line: i + 1, text });
    if (toggles) open = open ? null : kind;
  });
  return out;
}

describe("the product code's comments name files that exist", () => {
  it("every path with a folder and an extension in a comment is a tracked file", () => {
    const missing: string[] = [];
    let seen = 0;
    for (const file of TRACKED.filter((f) => PRODUCT.test(f))) {
      for (const { line, text } of commentLines(file, readFileSync(join(ROOT, file), "utf8")))
        for (const m of text.matchAll(CODE_PATH)) {
          if (m[1].startsWith("dist/")) continue;
          seen++;
          if (!resolves(file, { line, path: m[1], scope: "" }))
            missing.push(`${file}:${line}: ${m[1]}`);
        }
    }
    expect(seen, "no paths found in comments: the parser is broken").toBeGreaterThan(100);
    expect(missing, "name the file where it is now").toEqual([]);
  });
});
