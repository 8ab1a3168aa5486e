// `tpu-mcp workers [list] | drain NAME | undrain NAME | scale N | reload`: the CLI half of the
// control channel (server/control/channel.ts): workers.db beside a SQLite server, the shared
// channel every replica polls on storage.postgres (server/app/storage.ts openControlChannel).
// `list` only reads: on a data directory without a channel it says so and creates nothing. The
// others need an admin token, write the desired state and wait for a running server to report
// it applied.
import type { Logger } from "pino";
import type { AuditRecord } from "../../policies/audit.js";
import type { WorkerStatus } from "../../runtime/types.js";
import { createPolicyServices } from "../app/build_policies.js";
import { openControlChannel } from "../app/storage.js";
import type { ServerConfig } from "../config/config.js";
import type { ControlChannel, PublishedFleet } from "../control/channel.js";
import type { ReloadResult } from "../control/reload.js";
import { terminalField } from "../terminal.js";
import { principalOfToken } from "./token.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
  token?: string;
  /** How long `drain` waits for the worker's calls in flight to finish. */
  waitMs?: number;
}

export interface FleetWaitIo {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  waitMs?: number;
}

const NO_STATE =
  "no worker state recorded: is a server with a worker pool (runtime.workers) running on this data directory (or this database)?";

function row(w: WorkerStatus, at: string): string {
  const mem =
    w.memory_free_bytes != null ? ` free ${(w.memory_free_bytes / 2 ** 20).toFixed(0)} MiB` : "";
  // One line per worker, whatever its name or models hold.
  return terminalField(
    `${w.name.padEnd(10)} ${w.device.padEnd(8)} ${(w.address ? `remote ${w.address}` : "local").padEnd(24)} ` +
      `${w.state}${w.draining ? " (drained)" : ""}, in flight ${w.in_flight}, restarts ${w.restarts},${mem} ` +
      `models: ${w.models.join(", ") || "none"}${w.lost_models.length ? `; lost: ${w.lost_models.join(", ")}` : ""}  [seen ${at}]`,
  );
}

/** `workers list`: read-only, so a data directory no server has used stays untouched. */
async function listWorkers(config: ServerConfig, io: Io): Promise<number> {
  const opened = await openControlChannel(config, { existing: true, warn: io.err });
  try {
    const ws = (await opened?.channel.observed()) ?? [];
    if (io.json) io.out(JSON.stringify(ws, null, 2));
    else io.out(ws.length ? ws.map(({ w, at }) => row(w, at)).join("\n") : NO_STATE);
    return 0;
  } finally {
    await opened?.close();
  }
}

export async function runWorkersCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io,
): Promise<number> {
  const [sub = "list", name] = positionals;
  if (sub === "list") return await listWorkers(config, io);
  const scaleTo = sub === "scale" && /^\d{1,4}$/.test(name ?? "") ? Number(name) : undefined;
  const reload = sub === "reload" && name === undefined;
  if (
    (sub !== "drain" && sub !== "undrain" && scaleTo === undefined && !reload) ||
    (!name && !reload)
  ) {
    io.err(
      "usage: tpu-mcp workers [list] | drain NAME | undrain NAME | scale N (Ray fleet) | reload (re-read the config)  (--token T, an admin token)",
    );
    return 2;
  }
  const principal = await principalOfToken(
    config,
    io,
    "an admin token is required: --token TOKEN or TPU_MCP_TOKEN (a principal with the admin scope)",
  );
  if (typeof principal === "number") return principal;
  const admin = principal.scopes.includes("admin");
  const record = async (outcome: AuditRecord["outcome"], extra: Partial<AuditRecord> = {}) => {
    const policy = await createPolicyServices(config, io.logger);
    try {
      await policy.audit.append({
        time: new Date().toISOString(),
        principal: principal.id,
        tool: `workers.${sub}`,
        args_digest: null,
        args: scaleTo !== undefined ? { count: scaleTo } : reload ? {} : { worker: name },
        outcome,
        ...extra,
      });
    } finally {
      await policy.close();
    }
  };
  if (!admin) {
    await record("denied", {
      code: "insufficient_scope",
      reason: `workers ${sub} needs the admin scope`,
    });
    io.err(`insufficient_scope: ${principal.id} lacks the admin scope that ${sub} needs`);
    return 1;
  }
  if (scaleTo !== undefined) {
    // Audited like a gated call: `allowed` before (so a CLI killed while waiting still leaves a
    // trace), then what the fleet made of it: `executed`, or `failed` with its refusal.
    await record("allowed");
    const r = await scaleAndWait(config, scaleTo, principal.id, io);
    if (r.refused) await record("failed", { code: r.refused.code, reason: r.refused.reason });
    else if (r.exit !== 2)
      await record(
        "executed",
        r.gaveUp ? { reason: `target recorded, not reached: ${r.gaveUp}` } : {},
      );
    return r.exit;
  }
  await record("executed");
  if (reload) return await requestReload(config, principal.id, io);
  const opened = (await openControlChannel(config, { warn: io.err }))!;
  try {
    return await setDrain(opened.channel, sub as "drain" | "undrain", name!, principal.id, io);
  } finally {
    await opened.close();
  }
}

async function setDrain(
  channel: ControlChannel,
  sub: "drain" | "undrain",
  name: string,
  by: string,
  io: Io,
): Promise<number> {
  const known = (await channel.observed()).map((o) => o.w.name);
  if (known.length && !known.includes(name)) {
    io.err(`no worker named ${name}; workers: ${known.join(", ")}`);
    return 1;
  }
  if (sub === "undrain") {
    await channel.clearDrained(name);
    io.out(`${name}: undrained; the server routes calls to it again within a second`);
    return 0;
  }
  await channel.setDrained(name, by);
  const until = Date.now() + (io.waitMs ?? 60_000);
  for (;;) {
    const o = (await channel.observed()).find((x) => x.w.name === name);
    if (o?.w.draining && o.w.in_flight === 0) {
      io.out(
        io.json
          ? JSON.stringify(o.w, null, 2)
          : `${name}: drained, no calls in flight; it may be stopped (undrain with: tpu-mcp workers undrain ${name})`,
      );
      return 0;
    }
    if (Date.now() > until) {
      io.err(
        o
          ? `${name}: drained, but ${o.w.draining ? `${o.w.in_flight} calls still in flight` : "the server has not applied it yet"}; run tpu-mcp workers to follow`
          : `${name}: marked drained, but no running server has reported it yet`,
      );
      return 1;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** How a wait for the fleet ended: the exit code, and the fleet's refusal or why it gave up. */
interface FleetWait {
  exit: number;
  refused?: { code: string; reason: string };
  gaveUp?: string;
}

/**
 * `tpu-mcp workers scale N` (the caller has checked the admin token): records the wanted count,
 * then waits until the server's fleet reports that many actors serving.
 */
async function scaleAndWait(
  config: ServerConfig,
  count: number,
  by: string,
  io: FleetWaitIo,
): Promise<FleetWait> {
  if (!config.runtime.ray) {
    io.err("workers scale needs a Ray fleet: add runtime.ray to the config (README: Ray fleet)");
    return { exit: 2 };
  }
  const opened = (await openControlChannel(config, { warn: io.err }))!;
  try {
    const at = await opened.channel.setFleetTarget(count, by);
    return await waitForFleet(opened.channel, count, at, io);
  } finally {
    await opened.close();
  }
}

/** One line saying where the fleet stands against `count` (the CLI prints it when it changes). */
function fleetProgress(count: number, s: PublishedFleet): string {
  const actors = s.actors ?? [];
  const serving = actors.filter((a) => a.state === "up").length;
  const parts =
    s.state === "ready"
      ? [`${serving}/${count} serving`]
      : [`fleet driver ${s.state}${s.error ? ` (${s.error.code}: ${s.error.message})` : ""}`];
  const moving = actors.filter((a) => a.state !== "up").map((a) => `${a.name} ${a.state}`);
  if (moving.length) parts.push(moving.join(", "));
  if (actors.length > count) parts.push(`${actors.length - count} more to remove`);
  const e = s.last_actor_error;
  if (e) parts.push(`last actor error: ${e.name}: ${e.reason}`);
  return parts.join("; ");
}

const PROGRESS_EVERY_MS = 30_000;

/**
 * Waits until the server's fleet reports `count` actors serving, after the target set at `at`.
 * Says on stderr what it waits for whenever that changes (and every 30 s), and why it gives up.
 */
async function waitForFleet(
  channel: ControlChannel,
  count: number,
  at: string,
  io: FleetWaitIo,
): Promise<FleetWait> {
  const waitMs = io.waitMs ?? 5 * 60_000;
  const until = Date.now() + waitMs;
  let said = "";
  let saidAt = 0;
  let last = "";
  for (;;) {
    const o = await channel.fleetObserved();
    if (o && o.at > at) {
      const s = o.status;
      if (o.error && (o.target === count || s.state === "refused")) {
        io.err(`scale ${count} refused: ${o.error}`);
        const i = o.error.indexOf(": ");
        return {
          exit: 1,
          refused: {
            code: i > 0 ? o.error.slice(0, i) : "refused",
            reason: i > 0 ? o.error.slice(i + 2) : o.error,
          },
        };
      }
      const serving = (s.actors ?? []).filter((a) => a.state === "up").length;
      const total = (s.actors ?? []).length;
      if (o.target === count && serving === count && total === count) {
        io.out(
          io.json
            ? JSON.stringify(s, null, 2)
            : `Ray fleet at ${count} worker(s): ${(s.actors ?? []).map((a) => `${a.name} ${a.endpoint?.device ?? "?"}@${a.endpoint?.host ?? "?"}`).join(", ") || "none"}`,
        );
        return { exit: 0 };
      }
      last = fleetProgress(count, s);
      if (last !== said || Date.now() - saidAt > PROGRESS_EVERY_MS) {
        io.err(`waiting for ${count} worker(s): ${last}`);
        said = last;
        saidAt = Date.now();
      }
    }
    if (Date.now() > until) {
      const why = o
        ? `after ${Math.round(waitMs / 1000)} s: ${last || "the server has not applied it yet"}`
        : "no running server with a Ray fleet has picked it up";
      io.err(
        o
          ? `scale ${count} recorded, but the fleet did not reach it ${why}; the target stays in force (run tpu-mcp workers to follow)`
          : `scale recorded, but ${why}`,
      );
      return { exit: 1, gaveUp: why };
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** `tpu-mcp workers reload` (the caller has checked the admin token). */
export async function requestReload(
  config: ServerConfig,
  by: string,
  io: FleetWaitIo,
): Promise<number> {
  const opened = (await openControlChannel(config, { warn: io.err }))!;
  const channel = opened.channel;
  try {
    const at = await channel.requestReload(by);
    let result: ReloadResult | undefined;
    const until = Date.now() + Math.min(io.waitMs ?? 30_000, 30_000);
    for (;;) {
      const r = await channel.reloadResult();
      if (r?.request_at === at) {
        result = JSON.parse(r.result) as ReloadResult;
        break;
      }
      if (Date.now() > until) {
        io.err(
          "reload recorded, but no running server on this data directory (or this database) has picked it up",
        );
        return 1;
      }
      await new Promise((res) => setTimeout(res, 200));
    }
    if (!result.ok) {
      io.err(`reload refused, nothing changed: ${result.error ?? "?"}`);
      return 1;
    }
    if (io.json) io.out(JSON.stringify(result, null, 2));
    else {
      io.out(
        result.applied.length
          ? `applied: ${result.applied.join("; ")}`
          : "nothing to apply at run time",
      );
      if (result.restart.length)
        io.out(`changed, but needs a restart: ${result.restart.join(", ")}`);
    }
    if (result.fleet_target === undefined) return 0;
    const since = result.fleet_target_at ?? new Date(0).toISOString();
    return (
      await waitForFleet(channel, result.fleet_target, since, {
        ...io,
        out: io.json ? () => {} : io.out,
      })
    ).exit;
  } finally {
    await opened.close();
  }
}
