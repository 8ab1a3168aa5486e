// What a config reload can apply to a running server, and what needs a restart. Pure: compares
// two validated configs (the one the server runs with, the file as it is now) setting by setting.
//
// Applied at run time: the Ray fleet's actor count (runtime.ray.placement.count), through the
// same path as `tpu-mcp workers scale` (removals drain first), and the approval policy
// (policy.approvals: the gate's next calls decide under it, and approvals requested under the
// old one ask again). Everything else is reported as "needs a restart" by its dotted path, and
// left as it is.
import type { ServerConfig } from "./config.js";

/** Settings a reload applies without a restart (dotted paths). */
export const RELOADABLE = ["runtime.ray.placement.count", "policy.approvals"] as const;

export interface ConfigDiff {
  /** The fleet's new target when runtime.ray.placement.count changed: a number, or "capacity"
   *  when the count was removed (the driver's default: every slot the placement offers). */
  fleet_count?: number | "capacity";
  /** The approval policy's changed settings (dotted paths under policy.approvals). */
  approvals?: string[];
  /** Dotted paths of changed settings that take effect only after a restart. */
  restart: string[];
}

function changedPaths(a: unknown, b: unknown, path: string, out: string[]): void {
  if (a === b) return;
  const isObj = (v: unknown) => v !== null && typeof v === "object" && !Array.isArray(v);
  if (isObj(a) && isObj(b)) {
    const ao = a as Record<string, unknown>;
    const bo = b as Record<string, unknown>;
    for (const k of new Set([...Object.keys(ao), ...Object.keys(bo)]))
      changedPaths(ao[k], bo[k], path ? `${path}.${k}` : k, out);
    return;
  }
  // Arrays and scalars: changed as a whole (a list of tokens or workers is one setting).
  if (JSON.stringify(a) !== JSON.stringify(b)) out.push(path);
}

export function diffConfig(running: ServerConfig, next: ServerConfig): ConfigDiff {
  const { paths: _a, ...a } = running;
  const { paths: _b, ...b } = next;
  const changed: string[] = [];
  changedPaths(a, b, "", changed);
  // Derived paths (data_dir, catalog, python) resolved against the file: compare them too.
  changedPaths(
    {
      data_dir: running.paths.data_dir,
      catalog: running.paths.catalog,
      python: running.paths.python,
    },
    { data_dir: next.paths.data_dir, catalog: next.paths.catalog, python: next.paths.python },
    "paths",
    changed,
  );
  const diff: ConfigDiff = { restart: [] };
  for (const p of changed) {
    if (p === "runtime.ray.placement.count" && running.runtime.ray && next.runtime.ray)
      diff.fleet_count = next.runtime.ray.placement.count ?? "capacity";
    else if (p.startsWith("policy.approvals.") || p === "policy.approvals")
      (diff.approvals ??= []).push(p);
    else diff.restart.push(p);
  }
  diff.restart.sort();
  return diff;
}
