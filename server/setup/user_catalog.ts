// An installed package's catalog: the shipped runtime/catalog.builtin.json with its model roots
// pointed at the per-user model folder (the shipped file points into a clone's .data/models).
// Rewritten when it differs, so a package upgrade brings its new entries.
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import type { InstallLayout } from "../config/install_layout.js";
import { openUserHome } from "./user_home.js";

export function writeUserCatalog(layout: InstallLayout): void {
  if (layout.kind !== "package" || !layout.home) return;
  openUserHome(layout);
  const shipped = JSON.parse(readFileSync(layout.shippedCatalog, "utf8"));
  const text = JSON.stringify({ ...shipped, model_roots: [layout.models] }, null, 2) + "\n";
  if (existsSync(layout.catalog) && readFileSync(layout.catalog, "utf8") === text) return;
  mkdirSync(layout.models, { recursive: true });
  const tmp = `${layout.catalog}.${process.pid}.tmp`;
  writeFileSync(tmp, text);
  renameSync(tmp, layout.catalog);
}
