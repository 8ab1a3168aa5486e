// Builds the operator console and the MCP App view with esbuild into dist/console/:
//   index.html, assets app.js + app.css  (served at /console; no inline script, strict CSP)
//   mcp-app.html                         (one self-contained document: script and styles inline,
//                                         uPlot included, for ui://tpu-mcp/benchmark-view.html)
// Rebuilt only when a file under console/ (or the uPlot package) is newer than the last build.
import { build } from "esbuild";
import { mkdirSync, readdirSync, readFileSync, statSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeWhole } from "./lib/write_whole.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const src = join(root, "console");
const out = join(root, "dist", "console");
const stamp = join(out, ".built");

function newest(dir) {
  let t = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    t = Math.max(t, e.isDirectory() ? newest(p) : statSync(p).mtimeMs);
  }
  return t;
}

export function consoleIsStale() {
  if (!existsSync(stamp)) return true;
  const inputs = Math.max(
    newest(src),
    // Shared with the server's chart and bundled into the console.
    statSync(join(root, "tools", "render", "series.ts")).mtimeMs,
    statSync(join(root, "node_modules", "uplot", "package.json")).mtimeMs,
    statSync(fileURLToPath(import.meta.url)).mtimeMs,
  );
  return statSync(stamp).mtimeMs < inputs;
}

const common = {
  bundle: true,
  format: "iife",
  target: ["chrome110", "firefox110", "safari16"],
  minify: true,
  legalComments: "eof",
  logLevel: "error",
  write: false,
  outdir: out,
};

function pick(result, ext) {
  const f = result.outputFiles.find((o) => o.path.endsWith(ext));
  if (!f) throw new Error(`esbuild produced no ${ext}`);
  return f.text;
}

export async function buildConsole() {
  mkdirSync(join(out, "assets"), { recursive: true });
  const app = await build({ ...common, entryPoints: { app: join(src, "src", "app.ts") } });
  writeWhole(join(out, "assets", "app.js"), pick(app, ".js"));
  writeWhole(join(out, "assets", "app.css"), pick(app, ".css"));
  writeWhole(join(out, "index.html"), readFileSync(join(src, "index.html")));

  const view = await build({ ...common, entryPoints: { view: join(src, "src", "mcp_app.ts") } });
  // Inline text must not close its own element early.
  const js = pick(view, ".js").replace(/<\/(script)/gi, "<\\/$1");
  const css = pick(view, ".css").replace(/<\/(style)/gi, "<\\/$1");
  writeWhole(
    join(out, "mcp-app.html"),
    `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tpu-mcp benchmark view</title>
<style>${css}</style>
</head>
<body>
<main id="app"><p class="meta">Waiting for the tool result…</p></main>
<script>${js}</script>
</body>
</html>
`,
  );
  writeWhole(stamp, new Date().toISOString() + "\n");
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await buildConsole();
  process.stderr.write(`[build] ${out}\n`);
}
