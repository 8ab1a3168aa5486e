// `runtime.ray`: the Ray fleet (tpu_worker/fleet). Checked here for shape and again, in detail,
// by the driver itself (one source of truth for its semantics: fleet/config.py). Paths on the
// control host are resolved against the config file; `actor.catalog` names a file on the nodes.
import { isAbsolute, resolve } from "node:path";
import { z } from "zod";
import { DEVICE_KINDS } from "../../lib/device.js";

const Path = z.string().min(1);
const TpuChips = z.union([z.literal(1), z.literal(2), z.literal(4), z.literal(8)]);

export const RaySchema = z
  .object({
    /** The cluster's GCS address, host:port. */
    address: z
      .string()
      .regex(/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/, "use host:port, e.g. 10.0.0.2:6379"),
    /** Ray's token (RAY_AUTH_MODE=token); required unless allow_insecure_local on loopback. */
    token_file: Path.optional(),
    allow_insecure_local: z.boolean().default(false),
    /** Ray's own gRPC TLS (RAY_USE_TLS): PEM files on the control host. */
    tls: z.object({ ca: Path, cert: Path, key: Path }).strict().optional(),
    placement: z
      .object({
        mode: z.enum(["per-chip", "per-host", "count", "slice"]).default("per-chip"),
        count: z.number().int().min(0).max(4096).optional(),
        resources: z.record(z.string(), z.number().min(0)).optional(),
        chips_per_host: TpuChips.optional(),
        topology: z
          .string()
          .regex(/^\d+(x\d+){1,2}$/, 'e.g. "2x4" or "4x4x4"')
          .optional(),
        accelerator_version: z.string().min(2).max(16).optional(),
        num_slices: z.number().int().min(1).max(64).optional(),
        chips_per_vm: TpuChips.optional(),
        per: z.enum(["chip", "host"]).optional(),
        ready_timeout_s: z.number().positive().max(3600).optional(),
      })
      .strict()
      .prefault({}),
    actor: z
      .object({
        /** The catalog's path on the cluster's nodes. */
        catalog: Path,
        // Not xla: the fleet driver refuses it (tpu_worker/fleet/config.py).
        device: z.enum(["auto", ...DEVICE_KINDS.filter((k) => k !== "xla")]).default("auto"),
        threads: z.number().int().min(0).max(1024).optional(),
        num_cpus: z.number().min(0).optional(),
        max_restarts: z.number().int().min(0).max(1000).default(3),
        start_timeout_s: z.number().positive().max(3600).optional(),
        listen_host: z.string().min(1).optional(),
        worker_args: z.array(z.string()).max(16).optional(),
        /**
         * The node pre-check before any actor is placed (the worker package imports, the device
         * exists); false only where it cannot see what the actors will have (device files mounted
         * elsewhere, a simulated host).
         */
        preflight: z.boolean().default(true),
      })
      .strict(),
    /** The worker channel: actors require the control plane's client certificate and this token. */
    channel: z
      .object({
        /** CA (PEM) that signed `client.cert`; every actor's serve requires it. */
        client_ca: Path,
        token_file: Path,
      })
      .strict(),
    /** The control plane's client certificate and key for connecting to the actors. */
    client: z.object({ cert: Path, key: Path }).strict(),
    name_prefix: z
      .string()
      .regex(/^[A-Za-z][A-Za-z0-9-]{0,31}$/)
      .default("ray"),
    drain_timeout_s: z.number().positive().max(3600).default(60),
  })
  .strict()
  .refine((r) => r.token_file || r.allow_insecure_local, {
    message:
      "token_file is required (Ray's ports run code for anyone who reaches them; turn on RAY_AUTH_MODE=token), or allow_insecure_local: true for a loopback test cluster",
  });

export type RayConfig = z.infer<typeof RaySchema>;

/** Resolves the control host's paths against the config file's folder. */
export function resolveRayPaths(r: RayConfig, base: string): RayConfig {
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(base, p));
  return {
    ...r,
    token_file: r.token_file && abs(r.token_file),
    tls: r.tls && { ca: abs(r.tls.ca), cert: abs(r.tls.cert), key: abs(r.tls.key) },
    channel: { client_ca: abs(r.channel.client_ca), token_file: abs(r.channel.token_file) },
    client: { cert: abs(r.client.cert), key: abs(r.client.key) },
  };
}

/** The driver's own config file: everything but the client key pair (the driver never needs it). */
export function driverConfig(r: RayConfig): Record<string, unknown> {
  const { client: _client, ...rest } = r;
  return JSON.parse(JSON.stringify(rest)) as Record<string, unknown>;
}
