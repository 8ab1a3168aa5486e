// The README and docs/ are what a newcomer follows to the letter, so they are checked like code:
// every relative link resolves (a #anchor to a heading of its page), every server config example
// validates against the server's own schema, and the code snippets marked to run do run, as
// written, against a real server, and exit.
import { spawn } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ServerConfigSchema } from "../../server/config/config.js";
import { ROOT, startHttpServer, writeConfig, type HttpServerProc } from "../helpers/server.js";
import { scaled } from "../helpers/calibrate.js";

const PAGES = [
  join(ROOT, "README.md"),
  ...readdirSync(join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => join(ROOT, "docs", f)),
];
const read = (file: string) => readFileSync(file, "utf8");
const name = (file: string) => relative(ROOT, file);

interface Block {
  lang: string;
  body: string;
  /** What a `<!-- docs-test: ... -->` line right before the fence asks for, if any. */
  mark?: string;
  line: number;
}

function codeBlocks(md: string): Block[] {
  const lines = md.split("\n");
  const out: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\w*)/.exec(lines[i]);
    if (!open) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !lines[i].startsWith("```"); i++) body.push(lines[i]);
    let p = start - 1;
    while (p >= 0 && lines[p].trim() === "") p--;
    const mark = p >= 0 ? /^<!-- docs-test: (.+?) -->$/.exec(lines[p].trim())?.[1] : undefined;
    out.push({ lang: open[1], body: body.join("\n"), mark, line: start + 1 });
  }
  return out;
}

/** The page's prose: fenced blocks and inline code removed, so `[x](y)` in code is not a link. */
function prose(md: string): string {
  return md.replace(/^```[\s\S]*?^```/gm, "").replace(/`[^`\n]*`/g, "");
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, -1, -2 on repeats. */
function anchors(md: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of prose(md).matchAll(/^#{1,6} +(.+?) *#*$/gm)) {
    const text = m[1].replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1");
    const slug = text
      .toLowerCase()
      .replace(/[^\p{L}\p{N} _-]/gu, "")
      .replace(/ /g, "-");
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    out.add(n ? `${slug}-${n}` : slug);
  }
  return out;
}

/** Headings are the anchors of inline code too: keep their code spans' text. */
function anchorsOf(file: string): Set<string> {
  return anchors(read(file).replace(/^(#{1,6} .*)$/gm, (h) => h.replace(/`/g, "")));
}

/** JSON with comments and trailing commas (jsonc) → JSON; strings are left alone. */
function stripJsonc(text: string): string {
  let out = "";
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      const end = /"(?:[^"\\]|\\.)*"/y;
      end.lastIndex = i;
      const m = end.exec(text)!;
      out += m[0];
      i += m[0].length - 1;
    } else if (c === "/" && text[i + 1] === "/") {
      while (i < text.length && text[i] !== "\n") i++;
      out += "\n";
    } else out += c;
  }
  return out.replace(/,(\s*[}\]])/g, "$1");
}

const CONFIG_KEYS = new Set(Object.keys(ServerConfigSchema.shape));

describe("docs", () => {
  it("has a README a newcomer reads in ten minutes (at most 250 lines)", () => {
    expect(read(join(ROOT, "README.md")).split("\n").length).toBeLessThanOrEqual(250);
  });

  it("links only to files and headings that exist", () => {
    const broken: string[] = [];
    let checked = 0;
    for (const page of PAGES) {
      for (const m of prose(read(page)).matchAll(/!?\[[^\]]*\]\(([^)\s]+)(?: "[^"]*")?\)/g)) {
        const target = m[1];
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
        checked++;
        const [path, anchor] = target.split("#");
        const file = path ? resolve(dirname(page), decodeURIComponent(path)) : page;
        if (!existsSync(file)) broken.push(`${name(page)}: ${target} (no such file)`);
        else if (anchor && file.endsWith(".md") && !anchorsOf(file).has(anchor))
          broken.push(`${name(page)}: ${target} (no such heading in ${name(file)})`);
      }
    }
    expect(broken).toEqual([]);
    expect(checked).toBeGreaterThan(20);
  });

  it("knows GitHub's anchors (the link check relies on them)", () => {
    const a = anchors(
      "# A b\n## `tpu-mcp doctor --tpu`: the self-test\n## A b\n".replace(/`/g, ""),
    );
    expect([...a]).toEqual(["a-b", "tpu-mcp-doctor---tpu-the-self-test", "a-b-1"]);
  });

  it("shows server config examples that the server accepts", () => {
    const problems: string[] = [];
    let checked = 0;
    for (const page of PAGES) {
      for (const b of codeBlocks(read(page))) {
        if (!["json", "jsonc"].includes(b.lang)) continue;
        const where = `${name(page)}:${b.line}`;
        let raw: unknown;
        try {
          raw = JSON.parse(b.lang === "jsonc" ? stripJsonc(b.body) : b.body);
        } catch (e) {
          // Marked or plain JSON must parse; an unmarked jsonc block may be an annotated outline.
          if (b.mark === "config" || b.lang === "json")
            problems.push(`${where}: not JSON: ${(e as Error).message}`);
          continue;
        }
        // A config by its mark, or by its keys (client configs have mcpServers/servers instead).
        const keys = raw && typeof raw === "object" ? Object.keys(raw) : [];
        const isConfig = b.mark === "config" || keys.some((k) => CONFIG_KEYS.has(k));
        if (!isConfig) continue;
        checked++;
        const r = ServerConfigSchema.safeParse(raw);
        if (!r.success)
          problems.push(
            `${where}: ${r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`,
          );
      }
    }
    expect(problems).toEqual([]);
    expect(checked).toBeGreaterThanOrEqual(3);
    // The demo policy every page points to is a config example too.
    const demo = ServerConfigSchema.safeParse(
      JSON.parse(read(join(ROOT, "examples/policy.demo.json"))),
    );
    expect(demo.success, JSON.stringify(demo.error?.issues)).toBe(true);
  });

  it("rejects a config example with a misspelt key (the check above can fail)", () => {
    expect(ServerConfigSchema.safeParse({ runtime: { worker: "per-device" } }).success).toBe(false);
  });
});

/** Runs one marked snippet as written with tsx; resolves with its exit code and output. */
function runSnippet(source: string, env: Record<string, string>, timeoutMs: number) {
  // Inside the repository (under the ignored .data/) so that its imports resolve.
  mkdirSync(join(ROOT, ".data"), { recursive: true });
  const dir = mkdtempSync(join(ROOT, ".data", "docs-snippet-"));
  const file = join(dir, "snippet.ts");
  writeFileSync(file, source);
  const child = spawn(process.execPath, [join(ROOT, "node_modules/tsx/dist/cli.mjs"), file], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  return new Promise<{ code: number | null; timedOut: boolean; out: string }>((done) => {
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, timeoutMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
      done({ code, timedOut, out });
    });
  });
}

function snippet(mark: string): string {
  const found = PAGES.flatMap((p) => codeBlocks(read(p))).filter((b) => b.mark === mark);
  expect(found, `one block marked <!-- docs-test: ${mark} -->`).toHaveLength(1);
  expect(found[0].lang).toBe("ts");
  return found[0].body;
}

describe("docs snippets run as written", () => {
  let server: HttpServerProc;
  beforeAll(async () => {
    server = await startHttpServer(writeConfig());
  });
  afterAll(async () => {
    await server?.stop();
  });

  it("HTTP from code: calls the tools and exits", { timeout: scaled(120_000) }, async () => {
    const r = await runSnippet(
      snippet("run http"),
      { TPU_MCP_URL: server.url, TPU_MCP_TOKEN: server.token! },
      90_000,
    );
    expect(r.timedOut, `still running after 90 s:\n${r.out}`).toBe(false);
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain("name: 'embeddings'");
  });

  it(
    "a first chat: starts its own server, asks the built-in chat model, gets a true answer",
    { timeout: scaled(300_000) },
    async () => {
      // Loading SmolLM2 (269 MB) on a loaded 2-core VM takes tens of seconds: a generous bound.
      const r = await runSnippet(snippet("run stdio"), {}, 240_000);
      expect(r.timedOut, `still running after 240 s:\n${r.out}`).toBe(false);
      expect(r.code, r.out).toBe(0);
      expect(r.out).toContain("Paris");
    },
  );

  it(
    "a first chat on a laptop: the same snippet, its worker seeing 2 GiB free",
    { timeout: scaled(300_000) },
    async () => {
      // The server the snippet starts gets only the SDK's default environment, so the cap
      // (TPU_WORKER_FREE_MEMORY_BYTES, docs/troubleshooting.md) goes in its transport's env.
      const spawnLine = 'args: ["bin/tpu-mcp.js", "stdio"] }';
      const source = snippet("run stdio");
      expect(source).toContain(spawnLine);
      const capped = (bytes: number) =>
        source.replace(
          spawnLine,
          `args: ["bin/tpu-mcp.js", "stdio"], env: { TPU_WORKER_FREE_MEMORY_BYTES: "${bytes}" } }`,
        );
      const r = await runSnippet(capped(2 * 2 ** 30), {}, 240_000);
      expect(r.timedOut, `still running after 240 s:\n${r.out}`).toBe(false);
      expect(r.code, r.out).toBe(0);
      expect(r.out).toContain("Paris");
      // The cap reaches the worker: with 512 MiB free the load is refused up front.
      const short = await runSnippet(capped(512 * 2 ** 20), {}, 240_000);
      expect(short.timedOut, `still running after 240 s:\n${short.out}`).toBe(false);
      expect(short.code, short.out).not.toBe(0);
      expect(short.out).toContain("insufficient_memory");
    },
  );
});
