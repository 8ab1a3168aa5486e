// Message schemas for the worker pipe (runtime/PROTOCOL.md, "Messages"). Everything the worker
// sends is validated here before the client acts on it; objects are loose so a newer worker may
// add fields without breaking an older client.

import { z } from "zod";
import { DEVICE_KINDS } from "../../lib/device.js";
import type { StopReason, WorkerHello } from "../types.js";

export const PROTOCOL_VERSION = 1;

const deviceSchema = z.looseObject({
  kind: z.enum(DEVICE_KINDS),
  name: z.string(),
  index: z.number().int(),
  count: z.number().int(),
  memory_total_bytes: z.number().nullable(),
  memory_free_bytes: z.number().nullable(),
  backend: z.string(),
  backend_version: z.string().nullable(),
});

const probeSchema = z.looseObject({
  backend: z.string(),
  matched: z.boolean(),
  reason: z.string(),
});

export const helloSchema = z.looseObject({
  type: z.literal("hello"),
  protocol: z.number().int(),
  worker_version: z.string(),
  torch_version: z.string(),
  python_version: z.string(),
  pid: z.number().int(),
  device: deviceSchema,
  devices: z.array(deviceSchema),
  probe: z.array(probeSchema),
  backend_version: z.string().nullable(),
});

export const resultSchema = z.looseObject({
  type: z.literal("result"),
  id: z.string(),
  result: z.record(z.string(), z.unknown()),
});

export const errorSchema = z.looseObject({
  type: z.literal("error"),
  id: z.string().nullable(),
  error: z.looseObject({
    code: z.string().min(1),
    message: z.string(),
    recoverable: z.boolean(),
  }),
});

export const progressSchema = z.looseObject({
  type: z.literal("progress"),
  id: z.string(),
  progress: z.number(),
  total: z.number().optional(),
  message: z.string().optional(),
});

export const pongSchema = z.looseObject({
  type: z.literal("pong"),
  id: z.string(),
  time_s: z.number(),
});

/**
 * A shared remote worker's relay (`tpu_worker serve`) telling one control plane what another
 * loaded or unloaded there (runtime/PROTOCOL.md, "Remote workers"): `load` carries the load's
 * worker args and its result, as the loading control plane got them.
 */
export const fleetSchema = z.looseObject({
  type: z.literal("fleet"),
  op: z.enum(["load", "unload"]),
  model: z.string().min(1),
  args: z.record(z.string(), z.unknown()).optional(),
  result: z.record(z.string(), z.unknown()).optional(),
});

export const workerMessageSchema = z.discriminatedUnion("type", [
  helloSchema,
  resultSchema,
  errorSchema,
  progressSchema,
  pongSchema,
  fleetSchema,
]);

export type HelloMessage = z.infer<typeof helloSchema>;
export type ResultMessage = z.infer<typeof resultSchema>;
export type ErrorMessage = z.infer<typeof errorSchema>;
export type ProgressMessage = z.infer<typeof progressSchema>;
export type PongMessage = z.infer<typeof pongSchema>;
export type FleetMessage = z.infer<typeof fleetSchema>;
export type WorkerMessage = z.infer<typeof workerMessageSchema>;

export type ParseOutcome =
  { ok: true; message: WorkerMessage } | { ok: false; id: string | null; reason: string };

/** Validates a decoded frame header; never throws. `tensors` is checked by the framing layer. */
export function parseWorkerMessage(header: Record<string, unknown>): ParseOutcome {
  const r = workerMessageSchema.safeParse(header);
  if (r.success) return { ok: true, message: r.data };
  const id = typeof header.id === "string" ? header.id : null;
  const issues = r.error.issues
    .slice(0, 3)
    .map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`)
    .join("; ");
  return {
    ok: false,
    id,
    reason: `invalid ${String(header.type ?? "untyped")} message: ${issues}`,
  };
}

export function toHello(m: HelloMessage): WorkerHello {
  const rest: Record<string, unknown> = { ...m };
  delete rest.type;
  return rest as unknown as WorkerHello;
}

// Client → worker. `tensors` descriptors are added by encodeFrame.

export function requestMessage(id: string, op: string, args: Record<string, unknown>) {
  return { type: "request" as const, id, op, args };
}

/**
 * Cancels a request. With a `reason` ("budget" or "timeout": the gate stopped the call) the
 * worker ends it gracefully: a benchmark returns what it measured marked `stopped: reason`, a
 * generation finishes with that finish_reason; without one it is a plain cancellation.
 */
export function cancelMessage(id: string, reason?: StopReason) {
  return reason ? { type: "cancel" as const, id, reason } : { type: "cancel" as const, id };
}

export function pingMessage(id: string) {
  return { type: "ping" as const, id };
}
