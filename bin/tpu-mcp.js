#!/usr/bin/env node
// Starts the CLI from the prebuilt bundle when it is up to date (fast start: no TypeScript loader),
// else straight from the TypeScript sources through tsx (always correct, a few hundred ms slower).
import { existsSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { newestSource } from "../scripts/sources.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const bundle = join(root, "dist", "cli.mjs");

if (existsSync(bundle) && statSync(bundle).mtimeMs >= newestSource(root)) {
  await import(bundle);
} else {
  const { register } = await import("tsx/esm/api");
  register();
  await import("../server/cli/cli.ts");
}
