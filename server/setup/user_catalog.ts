// An installed package's catalog: the shipped runtime/catalog.builtin.json with its model roots
// pointed at the per-user model folder (the shipped file points into a clone's .data/models) and
// its dataset roots at the package's own runtime/datasets/.
// Rewritten when it differs, so a package upgrade brings its new entries.
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import type { InstallLayout } from "../config/install_layout.js";
import { openUserHome } from "./user_home.js";

export function writeUserCatalog(layout: InstallLayout): void {
  if (layout.kind !== "package" || !layout.home) return;
  openUserHome(layout);
  const shipped = JSON.parse(readFileSync(layout.shippedCatalog, "utf8"));
  // The shipped datasets stay in the package (read-only data, checked by their sha256).
  const base = dirname(layout.shippedCatalog);
  const datasetRoots = ((shipped.dataset_roots ?? []) as string[]).map((r) => resolve(base, r));
  const text =
    JSON.stringify(
      { ...shipped, model_roots: [layout.models], dataset_roots: datasetRoots },
      null,
      2,
    ) + "\n";
  if (existsSync(layout.catalog) && readFileSync(layout.catalog, "utf8") === text) return;
  mkdirSync(layout.models, { recursive: true });
  const tmp = `${layout.catalog}.${process.pid}.tmp`;
  writeFileSync(tmp, text);
  renameSync(tmp, layout.catalog);
}
