// `tpu-mcp doctor`, pool part: every configured worker is started (local) or connected to
// (remote: reachability, TLS both ways, token) and probed (its hello: device, torch), one by one.
import { pino } from "pino";
import { WorkerRuntime } from "../../runtime/client.js";
import {
  isRemote,
  remoteSpawn,
  type RemoteRefusal,
  type WorkerEntry,
} from "../../runtime/pool/index.js";
import type { ServerConfig } from "../config/config.js";
import { doctorWorkerOptions } from "./worker_options.js";

export interface WorkerCheck {
  name: string;
  ok: boolean;
  detail: string;
}

export async function checkWorkers(
  config: ServerConfig,
  opts: { timeoutMs?: number } = {},
): Promise<WorkerCheck[]> {
  const entries = Array.isArray(config.runtime.workers)
    ? (config.runtime.workers as WorkerEntry[])
    : [];
  const checks: WorkerCheck[] = [];
  for (const e of entries) checks.push(await checkOne(config, e, opts.timeoutMs ?? 120_000));
  return checks;
}

async function checkOne(
  config: ServerConfig,
  e: WorkerEntry,
  timeoutMs: number,
): Promise<WorkerCheck> {
  const refusals: RemoteRefusal[] = [];
  const base = doctorWorkerOptions(config, pino({ level: "silent" }));
  const rt = new WorkerRuntime({
    ...base,
    startTimeoutMs: timeoutMs,
    ...(isRemote(e)
      ? { spawn: remoteSpawn(e, (r) => refusals.push(r)) }
      : {
          device: e.device,
          extraArgs: e.threads ? ["--threads", String(e.threads)] : [],
        }),
  });
  const where = isRemote(e) ? `remote ${e.connect}` : `local ${e.device}`;
  try {
    const hello = await Promise.race([
      rt.ready(),
      new Promise<never>((_, rej) =>
        setTimeout(
          () => rej(new Error(`no hello within ${timeoutMs / 1000} s`)),
          timeoutMs,
        ).unref(),
      ),
    ]);
    const d = hello.device;
    const tls = isRemote(e) ? "TLS verified both ways, token accepted, " : "";
    return {
      name: e.name,
      ok: true,
      detail: `${where}: ${tls}${d.kind}:${d.index} (${d.name}), torch ${hello.torch_version}`,
    };
  } catch (err) {
    const r = refusals.find((x) => x.reason !== "unreachable") ?? refusals[0];
    const why =
      r?.reason === "busy"
        ? "TLS and token accepted, but it serves as many control planes as it takes (--max-control-planes): the running replicas?"
        : r?.reason === "unreachable"
          ? `not reachable (${r.message}): is \`tpu-mcp-worker serve\` running there, and the port open to this host?`
          : r
            ? `${r.reason === "tls" ? "TLS refused" : "token refused"}: ${r.message}`
            : (err as Error).message;
    return { name: e.name, ok: r?.reason === "busy", detail: `${where}: ${why}` };
  } finally {
    await rt.close();
  }
}
