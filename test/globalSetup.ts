// vitest globalSetup: makes sure the built-in model files exist before any test spawns a worker.
// `python -m tpu_worker.builtin` is idempotent, but importing torch costs seconds, so it only
// runs when a catalog entry's files are missing.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { slowdown } from "./helpers/calibrate.js";

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");

interface CatalogEntry {
  id: string;
  source: { path?: string };
}

/** Entries of the built-in catalog whose files are not (completely) on disk. */
export function missingBuiltinModels(root = repoRoot): string[] {
  const catalogPath = join(root, "runtime", "catalog.builtin.json");
  const catalog = JSON.parse(readFileSync(catalogPath, "utf8")) as {
    model_roots: string[];
    models: CatalogEntry[];
  };
  const modelRoot = resolve(dirname(catalogPath), catalog.model_roots[0]);
  return catalog.models
    .filter((m) => {
      if (!m.source.path) return false;
      const p = join(modelRoot, m.source.path);
      // The set-up could not make it here and left a note saying why (tpu_worker/builtin.py).
      if (existsSync(`${p}.unavailable`)) return false;
      if (!existsSync(p)) return true;
      // A directory model is complete when it has weights and a config.
      if (statSync(p).isDirectory()) {
        const files = readdirSync(p);
        return !files.some((f) => f.endsWith(".safetensors")) || !files.includes("config.json");
      }
      return statSync(p).size === 0;
    })
    .map((m) => m.id);
}

export function ensureBuiltinModels(root = repoRoot): void {
  const missing = missingBuiltinModels(root);
  if (missing.length === 0) return;
  process.stderr.write(`[globalSetup] creating built-in models (${missing.join(", ")})…\n`);
  const r = spawnSync(
    join(root, ".venv", "bin", "python"),
    ["-m", "tpu_worker.builtin", "--out", join(root, ".data", "models")],
    {
      cwd: root,
      stdio: ["ignore", "inherit", "inherit"],
      env: {
        ...process.env,
        PYTHONPATH: join(root, "runtime", "worker"),
        HF_HUB_OFFLINE: "1",
        TRANSFORMERS_OFFLINE: "1",
      },
      timeout: 600_000,
    },
  );
  if (r.status !== 0) {
    throw new Error(
      `python -m tpu_worker.builtin failed (exit ${r.status ?? r.signal}); run \`npm run setup\` and retry`,
    );
  }
  const still = missingBuiltinModels(root);
  if (still.length)
    throw new Error(`built-in models still missing after set-up: ${still.join(", ")}`);
}

export default function setup(): void {
  ensureBuiltinModels();
  // Measured when the config was loaded (its timeouts are scaled by it), or here: every test
  // process inherits it (test/helpers/calibrate.ts).
  slowdown();
}
