#!/usr/bin/env node
// Starts the CLI. An installed package has only the prebuilt bundle (dist/cli.mjs). A checkout
// uses the bundle while it is newer than every source (fast start: no TypeScript loader), else
// runs the TypeScript sources through tsx (always correct, a few hundred ms slower).
import { existsSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bundle = join(root, "dist", "cli.mjs");
const sources = join(root, "server", "cli", "cli.ts");

// What a desktop host shows of a failed start is stderr: one line that says what to do, never
// a stack trace.
function fail(what) {
  process.stderr.write(`tpu-mcp: ${what}\n`);
  process.exit(1);
}

try {
  if (!existsSync(sources)) {
    if (!existsSync(bundle)) fail(`the package is incomplete (no ${bundle}); reinstall tpu-mcp`);
    await import(bundle);
  } else {
    const { newestSource } = await import("../scripts/sources.mjs");
    if (existsSync(bundle) && statSync(bundle).mtimeMs >= newestSource(root)) {
      await import(bundle);
    } else {
      const { register } = await import("tsx/esm/api");
      register();
      await import("../server/cli/cli.ts");
    }
  }
} catch (e) {
  const missing = e?.code === "ERR_MODULE_NOT_FOUND";
  // The native module's package is gone when its build failed at install (the bundle imports it).
  if (missing && /better-sqlite3/.test(e.message))
    fail(
      'the native SQLite module better-sqlite3 is not installed (its build fails without a prebuilt binary for this Node and platform, or the build tools). npm\'s log of the install is in ~/.npm/_logs; use a Node LTS release or install Python 3, make and a C++ compiler, then reinstall tpu-mcp (docs/troubleshooting.md, "The native module (better-sqlite3)")',
    );
  fail(
    missing
      ? `a Node package is missing (${e.message.split("\n")[0]}); in a checkout run \`npm run setup\`, else reinstall tpu-mcp`
      : `cannot start: ${e?.message ?? e}`,
  );
}
