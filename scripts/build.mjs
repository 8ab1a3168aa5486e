// Bundles the TypeScript sources into dist/cli.mjs (npm packages stay external) so the CLI starts
// without a TypeScript loader: tools/list answers within half a second of process start.
// bin/tpu-mcp.js uses the bundle only while it is newer than every source file. dist/ sits one
// level below the root like runtime/ (server/cli/cli.ts finds the root by its package.json).
import { build } from "esbuild";
import { mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { newestSource } from "./sources.mjs";
import { writeWhole } from "./lib/write_whole.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = join(root, "dist", "cli.mjs");

/** esbuild's outputs (the bundle and its map), each written whole (scripts/lib/write_whole.mjs). */
function writeOutputs(result) {
  mkdirSync(join(root, "dist"), { recursive: true });
  for (const f of result.outputFiles) writeWhole(f.path, f.contents);
}

export async function buildCli({ quiet = false } = {}) {
  const cli = await build({
    entryPoints: [join(root, "server", "cli", "cli.ts")],
    outfile: out,
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    packages: "external",
    sourcemap: "linked",
    logLevel: quiet ? "error" : "warning",
    write: false,
  });
  writeOutputs(cli);
  // The receiver's verifier on its own (docs/security.md#audit-export): Node built-ins only.
  const verifier = await build({
    entryPoints: [join(root, "server", "cli", "verify_export_main.ts")],
    outfile: join(root, "dist", "verify-export.mjs"),
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    logLevel: quiet ? "error" : "warning",
    write: false,
  });
  writeOutputs(verifier);
  return { out, newest: newestSource(root) };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await buildCli();
  process.stderr.write(`[build] ${out}\n`);
}
