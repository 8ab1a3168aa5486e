// Config reload: on SIGHUP, or `tpu-mcp workers reload` (admin; through workers.db like
// `workers scale`; control/channel.ts), the server re-reads its config file, validates it with the same schema as at
// start-up, and applies what can change at run time (server/config/diff.ts: the Ray fleet's
// actor count, through the `workers scale` path, so removals drain first). An invalid file is
// refused with a clear log line and nothing changes; other changed settings are logged as
// needing a restart.
//
// The catalog file is read again too: models added to it are served at once (every running worker
// adds them, then the tools list and accept them, and 2025 sessions get tools/list_changed); a
// changed or removed entry needs a restart (a loaded model must not change under its callers).
// A catalog that does not validate is refused like an invalid config.
import type { Logger } from "pino";
import { readCatalog, type Catalog } from "../../runtime/catalog.js";
import type { Fleet } from "../../runtime/fleet/ray.js";
import { ConfigError, type ServerConfig } from "../config/config.js";
import { diffConfig } from "../config/diff.js";
import type { ControlChannel, ControlHandler } from "./channel.js";

export interface ReloadResult {
  ok: boolean;
  /** What was applied, e.g. "runtime.ray.placement.count: 2 -> 3". */
  applied: string[];
  /** Changed settings that need a restart (left as they are). */
  restart: string[];
  /** The fleet's new target, when the reload changed it. */
  fleet_target?: number;
  /** When that target was recorded (the CLI waits for fleet state newer than this). */
  fleet_target_at?: string;
  error?: string;
}

/** The catalog the server serves, and how a reload makes a grown one served (server/app). */
export interface CatalogReload {
  current(): Catalog;
  /** The workers first, then the tools: a model listed is one a worker can load. */
  apply(next: Catalog): Promise<void>;
}

/** How a reload puts a changed approval policy in effect (the gate: Gate.applyApprovals). */
export interface ApprovalsReload {
  apply(next: ServerConfig["policy"]["approvals"]): void;
}

/** What the file adds to the served catalog, and what only a restart would change. */
export function diffCatalog(
  served: Catalog,
  file: Catalog,
): { next: Catalog; added: string[]; changed: string[]; removed: string[] } {
  const before = new Map(served.models.map((m) => [m.id, m]));
  const after = new Map(file.models.map((m) => [m.id, m]));
  const added = file.models.filter((m) => !before.has(m.id));
  const changed = served.models
    .filter((m) => after.has(m.id) && JSON.stringify(after.get(m.id)) !== JSON.stringify(m))
    .map((m) => m.id);
  const removed = served.models.filter((m) => !after.has(m.id)).map((m) => m.id);
  const roots = [
    ...served.model_roots,
    ...file.model_roots.filter((r) => !served.model_roots.includes(r)),
  ];
  return {
    next: { ...served, model_roots: roots, models: [...served.models, ...added] },
    added: added.map((m) => m.id),
    changed,
    removed,
  };
}

export interface Reloader {
  reload(by: string): Promise<ReloadResult>;
}

/**
 * `load` reads and validates the config file again (the CLI's loadConfig with the same command
 * line overrides); `running` is the config the server started from (before any token the CLI
 * generated for itself).
 */
export function createReloader(
  running: ServerConfig,
  load: (() => ServerConfig) | undefined,
  /** The Ray fleet (runtime.ray), whose capacity a removed count stands for. */
  fleet: Fleet | undefined,
  logger: Logger,
  channel: ControlChannel,
  /** Absent: the catalog is not read again (a test's app without one). */
  catalog?: CatalogReload,
  /** Absent: a changed approval policy needs a restart. */
  approvals?: ApprovalsReload,
): Reloader {
  let current = running;
  let busy: Promise<ReloadResult> | null = null;
  const run = async (by: string): Promise<ReloadResult> => {
    if (!load) {
      const error = "this server was started without a config file; there is nothing to reload";
      logger.warn({ by }, `config reload refused: ${error}`);
      return { ok: false, applied: [], restart: [], error };
    }
    let next: ServerConfig;
    try {
      next = load();
    } catch (e) {
      const error = e instanceof ConfigError ? e.message : `cannot read the config: ${String(e)}`;
      logger.error({ by }, `config reload refused, nothing changed: ${error}`);
      return { ok: false, applied: [], restart: [], error };
    }
    const diff = diffConfig(current, next);
    if (diff.approvals && !approvals) diff.restart.push(...diff.approvals);
    const result: ReloadResult = { ok: true, applied: [], restart: diff.restart };
    // Another catalog file needs a restart (diffConfig says so); the same one may have grown.
    let grown: ReturnType<typeof diffCatalog> | undefined;
    if (catalog && !diff.restart.includes("paths.catalog")) {
      try {
        grown = diffCatalog(catalog.current(), readCatalog(next.paths.catalog));
      } catch (e) {
        const error = (e as Error).message;
        logger.error({ by }, `config reload refused, nothing changed: ${error}`);
        return { ok: false, applied: [], restart: [], error };
      }
      for (const id of grown.changed) result.restart.push(`catalog: ${id} (changed)`);
      for (const id of grown.removed) result.restart.push(`catalog: ${id} (removed)`);
    }
    if (diff.fleet_count !== undefined) {
      const count =
        diff.fleet_count === "capacity" ? (fleet?.status().capacity ?? 0) : diff.fleet_count;
      // The same desired state `workers scale` writes: the fleet watcher applies it (drain first).
      result.fleet_target_at = await channel.setFleetTarget(count, `config-reload (${by})`);
      result.applied.push(
        `runtime.ray.placement.count: ${current.runtime.ray?.placement.count ?? "capacity"} -> ${next.runtime.ray?.placement.count ?? "capacity"} (target ${count})`,
      );
      result.fleet_target = count;
      const ray = current.runtime.ray!;
      current = Object.freeze({
        ...current,
        runtime: Object.freeze({
          ...current.runtime,
          ray: Object.freeze({
            ...ray,
            placement: Object.freeze({
              ...ray.placement,
              count: next.runtime.ray!.placement.count,
            }),
          }),
        }),
      }) as ServerConfig;
    }
    if (diff.approvals && approvals) {
      approvals.apply(next.policy.approvals);
      current = Object.freeze({
        ...current,
        policy: Object.freeze({ ...current.policy, approvals: next.policy.approvals }),
      }) as ServerConfig;
      result.applied.push(
        `${diff.approvals.join(", ")} (approvals requested under the old policy ask again)`,
      );
    }
    if (catalog && grown?.added.length) {
      try {
        await catalog.apply(grown.next);
        result.applied.push(`catalog: added ${grown.added.join(", ")}`);
      } catch (e) {
        result.ok = false;
        result.error = `the catalog's new models (${grown.added.join(", ")}) were not added: ${(e as Error).message}`;
        logger.error({ by }, `config reload: ${result.error}`);
      }
    }
    logger.warn(
      { by, applied: result.applied, needs_restart: result.restart },
      result.applied.length || result.restart.length
        ? `config reloaded: ${result.applied.length ? `applied ${result.applied.join("; ")}` : "nothing to apply at run time"}${result.restart.length ? `; these changed settings need a restart: ${result.restart.join(", ")}` : ""}`
        : "config reloaded: no change",
    );
    return result;
  };
  return {
    reload(by) {
      // One at a time: a second SIGHUP during a reload waits for the first.
      const p = (busy ?? Promise.resolve()).then(() => run(by));
      busy = p.catch(() => ({ ok: false, applied: [], restart: [] }));
      return p;
    },
  };
}

/**
 * Runs each new `tpu-mcp workers reload` request once and writes its result. A request made
 * before this server started is not replayed.
 */
export function reloadHandler(
  channel: ControlChannel,
  reloader: Reloader,
  logger: Logger,
): ControlHandler {
  // The request standing when the server started, read before the first tick's (unreadable:
  // none, so a standing request runs once; a reload is safe to repeat).
  const before = channel.reloadRequest().then(
    (r) => r?.at ?? null,
    () => null,
  );
  let handled: string | null | undefined;
  return {
    name: "reload",
    async tick(ch) {
      if (handled === undefined) handled = await before;
      const req = await ch.reloadRequest();
      if (!req || req.at === handled) return;
      handled = req.at;
      try {
        const r = await reloader.reload(`workers reload by ${req.by}`);
        await ch.writeReloadResult(req.at, r);
      } catch (e) {
        logger.warn({ err: String(e) }, "config reload request failed");
      }
    },
  };
}
