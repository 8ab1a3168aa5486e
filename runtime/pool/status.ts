// How a pool's worker looks in get_runtime_status and /metrics (WorkerStatus).
import type { WorkerStatus } from "../types.js";
import { isRemote } from "./entries.js";
import type { Member } from "./member.js";

/** `bytesHeld`: what the pool placed on this worker (counts against a memory_bytes share). */
export function statusOf(m: Member, bytesHeld: number): WorkerStatus {
  const dev = m.rt.hello?.device;
  const share = isRemote(m.entry) ? undefined : m.entry.memory_bytes;
  return {
    name: m.name,
    device: m.device,
    kind: m.remote ? "remote" : "local",
    address: isRemote(m.entry) ? m.entry.connect : null,
    state: m.rt.state,
    draining: m.draining,
    restarts: m.rt.restarts(),
    pid: m.rt.hello?.pid ?? null,
    in_flight: m.rt.inFlight(),
    calls: m.calls,
    failures: m.failures,
    memory_total_bytes: share ?? m.lastTotal ?? dev?.memory_total_bytes ?? null,
    memory_free_bytes: m.free(bytesHeld),
    models: m.models().map((x) => x.model),
    lost_models: m.lostModels(),
    last_error: m.rt.lastError(),
    chip: dev ? { kind: dev.kind, index: dev.index, name: dev.name, backend: dev.backend } : null,
    ...(m.relay && m.rt.state === "ready" ? { shared: m.relay } : {}),
  };
}
