// One zod schema for the whole config file, validated once and frozen. Every problem is reported
// with its path in the file so a newcomer can fix it without reading code.
import { readFileSync } from "node:fs";
import { dirname, isAbsolute, resolve } from "node:path";
import { z } from "zod";
import { policyConfigSchema } from "../../policies/config.js";
import { TOOL_POLICIES } from "../../tools/registry.js";
import { RaySchema, resolveRayPaths } from "./ray.js";
import { EnginesSchema, resolveVllmPaths } from "./engines.js";
import { layoutOf, type InstallLayout } from "./install_layout.js";
import { DEVICE_KIND_ALTERNATION } from "../../lib/device.js";
import { RESERVED_NAMES } from "../../runtime/pool/entries.js";

const DeviceSchema = z
  .string()
  .regex(
    new RegExp(`^(auto|${DEVICE_KIND_ALTERNATION})(:\\d{1,2})?$`),
    "use auto, cpu, cuda, tpu or xla, optionally with :index",
  );

const WorkerName = z
  .string()
  .regex(
    /^[A-Za-z][A-Za-z0-9_.-]{0,62}$/,
    "a letter, then letters, digits, _ . - (e.g. w0, vm2-tpu3)",
  )
  .refine((n) => !RESERVED_NAMES.test(n), "a worker name may not look like a device");

const LocalWorkerSchema = z
  .object({
    name: WorkerName,
    device: DeviceSchema,
    /** torch intra-op threads for this worker; 0 keeps torch's default. */
    threads: z.number().int().min(0).max(1024).optional(),
    /** Memory the pool may place on this worker (workers sharing one host's RAM). */
    memory_bytes: z.number().int().positive().optional(),
  })
  .strict();

const RemoteWorkerSchema = z
  .object({
    name: WorkerName,
    connect: z
      .string()
      .regex(/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/, "use host:port, e.g. 10.0.0.5:7900"),
    tls: z
      .object({
        ca: z.string().min(1),
        cert: z.string().min(1),
        key: z.string().min(1),
        server_name: z.string().min(1).optional(),
      })
      .strict(),
    token_file: z.string().min(1),
  })
  .strict();

const WorkersSchema = z.union([
  z.literal("single"),
  z.literal("per-device"),
  z
    .array(z.union([RemoteWorkerSchema, LocalWorkerSchema]))
    .min(1)
    .max(256)
    .refine(
      (ws) => new Set(ws.map((w) => w.name)).size === ws.length,
      "worker names must be unique",
    ),
]);

export const ServerConfigSchema = z
  .object({
    /** Where SQLite stores (approvals, audit, jobs, reports) and generated files live. */
    data_dir: z.string().default(".data"),
    /** Which backend holds the stores and the counters shared across calls (server/app/storage.ts):
     *  `{"sqlite": {}}`, the files in data_dir, or `{"postgres": {"url": …}}` (the URL, with its
     *  password, may come from TPU_MCP_DATABASE_URL instead; docs/storage.md). */
    storage: z
      .union([
        z.object({ sqlite: z.object({}).strict() }).strict(),
        z
          .object({
            postgres: z
              .object({
                url: z.string().min(1).optional(),
                /** This replica's name in the shared store (jobs' owner, reservations, audit
                 *  rows, the metrics' `replica` label); default host:port (server/app/replica.ts). */
                replica_id: z
                  .string()
                  .regex(/^[A-Za-z0-9._:@-]{1,128}$/, "letters, digits and . _ : @ - (at most 128)")
                  .optional(),
                /** A job's lease: its replica renews it every third of this; only an expired
                 *  lease marks the job interrupted (a replica that died stops renewing). */
                job_lease_s: z.number().min(1).max(3600).default(30),
                /** The shared Ray fleet driver's lease (runtime.ray): its replica renews it every
                 *  third of this; another replica takes the driver over once it expired. */
                fleet_lease_s: z.number().min(1).max(3600).default(10),
                /** How far this replica's clock may be off the database's: beyond it the replica
                 *  refuses to start (server/app/postgres/db_clock.ts; sync the clock with NTP). */
                max_clock_skew_ms: z.number().int().min(100).max(600_000).default(5_000),
                /** A call in flight whose replica stopped stamping it alive (every third of
                 *  this) for this long is charged by a live replica: its replica died. */
                call_lease_s: z.number().min(1).max(3600).default(15),
              })
              .strict(),
          })
          .strict(),
      ])
      .prefault({ sqlite: {} }),
    log_level: z
      .enum(["trace", "debug", "info", "warn", "error", "fatal", "silent"])
      .default("info"),
    /** auto: short text lines when stderr is a terminal, JSON lines otherwise (server/app/logger.ts). */
    log_format: z.enum(["auto", "json", "pretty"]).default("auto"),
    /** Per-call timestamps for `npm run bench`'s decomposition, returned to callers that ask
     * with `_meta["tpu-mcp/trace"]`. Off by default: a measurement aid, not a feature. */
    trace_calls: z.boolean().default(false),
    /** OpenTelemetry export (docs/observability.md); the standard OTEL_* variables win. */
    telemetry: z
      .object({
        /** OTLP/HTTP base URL (as OTEL_EXPORTER_OTLP_ENDPOINT): spans go to {url}/v1/traces. */
        otlp_endpoint: z.string().url().optional(),
        /** As OTEL_EXPORTER_OTLP_PROTOCOL. */
        otlp_protocol: z.enum(["http/protobuf", "http/json"]).optional(),
        /** As OTEL_SERVICE_NAME. */
        service_name: z.string().min(1).max(200).optional(),
      })
      .strict()
      .default({}),
    http: z
      .object({
        host: z.string().default("127.0.0.1"),
        port: z.number().int().min(0).max(65535).default(7801),
        /** Origins allowed to call /mcp from a browser; requests with any other Origin get 403. */
        allowed_origins: z.array(z.string()).default([]),
        /** Extra Host header values accepted besides loopback names and the bound address. */
        allowed_hosts: z.array(z.string()).default([]),
        max_body_bytes: z
          .number()
          .int()
          .min(1024)
          .max(256 * 1024 * 1024)
          .default(32 * 1024 * 1024),
        /** The canonical URL of this resource server (JWT audience, RFC 9728 metadata). */
        resource_url: z.string().url().optional(),
        session_idle_s: z.number().int().min(10).default(1800),
        max_sessions: z.number().int().min(1).default(256),
        /** Open sessions per principal; over it, that principal's oldest idle session is closed. */
        max_sessions_per_principal: z.number().int().min(1).default(32),
        /** New sessions (`initialize`) allowed per minute, with bursts up to the same number. */
        initialize_rate: z
          .object({
            per_principal_per_minute: z.number().int().min(1).default(60),
            per_address_per_minute: z.number().int().min(1).default(120),
          })
          .strict()
          .prefault({}),
        /**
         * Failed authentication on every path (bearer tokens, console sign-in): free failures
         * per client address, then back-off doubling up to max_backoff_s; and a server-wide
         * budget of failures per minute (server/auth_limit.ts).
         */
        auth_limit: z
          .object({
            free_failures: z.number().int().min(1).default(10),
            max_backoff_s: z.number().positive().max(3600).default(15),
            failures_per_minute: z.number().int().min(1).default(300),
          })
          .strict()
          .prefault({}),
        /** Console sessions per principal; one more signs out its least recently used one. */
        console_sessions_per_principal: z.number().int().min(1).default(8),
        /** /metrics needs a token with metrics:read: "auto" = unless bound to loopback. */
        metrics_auth: z.enum(["auto", "token"]).default("auto"),
      })
      .strict()
      .prefault({}),
    runtime: z
      .object({
        python: z.string().default(".venv/bin/python"),
        catalog: z.string().default("runtime/catalog.builtin.json"),
        device: DeviceSchema.default("auto"),
        /**
         * torch intra-op threads in the worker; 0 = one fewer than the host's cores (at least
         * one), so the worker's busy-waiting OpenMP threads leave a core to the control plane.
         */
        threads: z.number().int().min(0).max(1024).default(0),
        /** eager: start the worker with the server; lazy: on the first call that needs it. */
        start: z.enum(["eager", "lazy"]).default("eager"),
        request_timeout_s: z.number().positive().max(86_400).default(600),
        heartbeat_interval_s: z.number().positive().default(5),
        heartbeat_timeout_s: z.number().positive().default(20),
        /**
         * How long a call the gate stopped (budget, timeout) may take to end in the worker before
         * the worker is restarted (its other calls with it). The caller is answered after the
         * gate's own 10 s either way; a slow host may give its workers longer to confirm.
         */
        stop_grace_s: z.number().positive().max(600).default(8),
        max_restarts: z.number().int().min(0).default(5),
        restart_window_s: z.number().positive().default(60),
        /**
         * The pool: "single" (one local worker on `device`), "per-device" (one local worker per
         * chip, from the worker's inventory), or a list of local and remote workers. Unset: per
         * device on a host with several accelerator chips, else single (CPU: unchanged).
         */
        workers: WorkersSchema.optional(),
        /** A Ray cluster that places more workers (server/config/ray.ts, README "Ray fleet"). */
        ray: RaySchema.optional(),
        /**
         * Engines beside the worker's PyTorch: `vllm` serves catalog entries with
         * "engine": "vllm" (server/config/engines.ts, docs/vllm.md). Unset: vLLM from the
         * repository's .venv-vllm with the defaults.
         */
        engines: EnginesSchema,
        /** Calls in flight one replica takes before routing looks elsewhere; then `busy`. */
        max_in_flight_per_replica: z.number().int().min(1).max(4096).default(16),
        busy_retry_after_ms: z.number().int().min(1).max(60_000).default(100),
      })
      .strict()
      .prefault({}),
    inference: z
      .object({
        /** Outputs with more elements than this are summarised and linked as a resource. */
        inline_max_elements: z.number().int().min(0).default(4096),
        max_texts: z.number().int().min(1).max(4096).default(64),
        max_tensor_elements: z
          .number()
          .int()
          .min(1)
          .default(16 * 1024 * 1024),
        outputs_max_bytes: z
          .number()
          .int()
          .min(0)
          .default(512 * 1024 * 1024),
        /**
         * One prefix cache partition for every principal (generation reuses another principal's
         * prompt prefix). Off by default: a shared cache is a timing side channel, a hit answering
         * faster tells a caller that someone sent that prefix (docs/security.md).
         */
        prefix_cache_shared: z.boolean().default(false),
      })
      .strict()
      .prefault({}),
    benchmark: z
      .object({
        max_configs: z.number().int().min(1).default(64),
        max_iterations: z.number().int().min(1).default(10_000),
        max_duration_s: z.number().positive().default(600),
        max_warmup: z.number().int().min(0).default(100),
      })
      .strict()
      .prefault({}),
    /**
     * Kept fine-tune results (run_benchmark work fine_tune, keep): the bytes of kept weights one
     * principal may hold, and how long each lives (docs/benchmarks.md).
     */
    kept: z
      .object({
        max_bytes_per_principal: z
          .number()
          .int()
          .min(0)
          .default(2 * 1024 ** 3),
        ttl_s: z
          .number()
          .positive()
          .default(7 * 86_400),
      })
      .strict()
      .prefault({}),
    policy: policyConfigSchema(TOOL_POLICIES).prefault({}),
  })
  .strict();

export type ServerConfig = z.infer<typeof ServerConfigSchema> & {
  /** Absolute paths derived from the file's location; filled by loadConfig. */
  readonly paths: {
    /** The code's folder (the checkout or the installed package): install.root. */
    root: string;
    /** Where code assets, the Python environment and the built-in models live. */
    install: InstallLayout;
    data_dir: string;
    catalog: string;
    python: string;
    /** The config file's folder (the root without a file): other relative paths start here. */
    config_dir: string;
    /** The config file, absolute; null when running on the defaults. */
    config_file: string | null;
    /** The audit chain's key file (policy.audit.key_file, else inside data_dir). */
    audit_key: string;
  };
};

export class ConfigError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[]) {
    super(`invalid config ${source}:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === "object" && !Object.isFrozen(o)) {
    Object.freeze(o);
    for (const v of Object.values(o)) deepFreeze(v);
  }
  return o;
}

/**
 * Parses a config object. `root` is the code's folder; `layout` (by default a clone's at `root`)
 * gives the defaults of the built-in catalog, the venv and data_dir. Relative paths in a config
 * file are resolved against the file's own folder.
 */
export function parseConfig(
  raw: unknown,
  opts: { root: string; layout?: InstallLayout; base?: string; source?: string; file?: string },
) {
  const parsed = ServerConfigSchema.safeParse(raw ?? {});
  if (!parsed.success) {
    const problems = parsed.error.issues.map(
      (i) => `${i.path.length ? i.path.join(".") : "(top level)"}: ${i.message}`,
    );
    throw new ConfigError(opts.source ?? "(inline)", problems);
  }
  const c = parsed.data;
  const base = opts.base ?? opts.root;
  const layout = opts.layout ?? layoutOf("clone", opts.root);
  const abs = (p: string, from: string) => (isAbsolute(p) ? p : resolve(from, p));
  // Defaults come from the install layout; values the user wrote are relative to their file.
  const defaults = { catalog: layout.catalog, python: layout.python };
  const fromLayout = (key: "catalog" | "python") =>
    (raw as any)?.runtime?.[key] !== undefined ? abs(c.runtime[key], base) : defaults[key];
  // The device given on the command line overrides the file (applyOverrides put it in raw).
  const data_dir = (raw as any)?.data_dir !== undefined ? abs(c.data_dir, base) : layout.dataDir;
  const keyFile = c.policy.audit.key_file;
  // Certificate and token paths of remote workers are relative to the config file too.
  const workers = Array.isArray(c.runtime.workers)
    ? c.runtime.workers.map((w) =>
        "connect" in w
          ? {
              ...w,
              token_file: abs(w.token_file, base),
              tls: {
                ...w.tls,
                ca: abs(w.tls.ca, base),
                cert: abs(w.tls.cert, base),
                key: abs(w.tls.key, base),
              },
            }
          : w,
      )
    : c.runtime.workers;
  const config: ServerConfig = {
    ...c,
    runtime: {
      ...c.runtime,
      workers,
      ray: c.runtime.ray && resolveRayPaths(c.runtime.ray, base),
      engines: {
        ...c.runtime.engines,
        vllm:
          c.runtime.engines.vllm &&
          resolveVllmPaths(
            c.runtime.engines.vllm,
            base,
            layout.vllmPython,
            (raw as any)?.runtime?.engines?.vllm?.python !== undefined,
          ),
      },
    },
    paths: {
      root: opts.root,
      install: layout,
      data_dir,
      catalog: fromLayout("catalog"),
      python: fromLayout("python"),
      config_dir: base,
      config_file: opts.file ?? null,
      audit_key: keyFile ? abs(keyFile, base) : resolve(data_dir, "audit.key"),
    },
  };
  return deepFreeze(config);
}

/** Command-line values that override the file. */
export interface ConfigOverrides {
  device?: string;
}

function applyOverrides(raw: unknown, o: ConfigOverrides): unknown {
  if (!o.device) return raw;
  const r = (raw ?? {}) as Record<string, any>;
  return { ...r, runtime: { ...(r.runtime ?? {}), device: o.device } };
}

export function loadConfig(
  file: string | undefined,
  root: string,
  overrides: ConfigOverrides = {},
  layout?: InstallLayout,
): ServerConfig {
  if (!file)
    return parseConfig(applyOverrides({}, overrides), { root, layout, source: "(defaults)" });
  const path = resolve(file);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new ConfigError(file, [
      `cannot read the file: ${(e as NodeJS.ErrnoException).code ?? e}`,
    ]);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new ConfigError(file, [`not valid JSON: ${(e as Error).message}`]);
  }
  return parseConfig(applyOverrides(raw, overrides), {
    root,
    layout,
    base: dirname(path),
    source: file,
    file: path,
  });
}

/** A copy of the config with one more static token (the one `tpu-mcp http` generates). */
export function withToken(
  config: ServerConfig,
  token: ServerConfig["policy"]["tokens"][number],
): ServerConfig {
  return deepFreeze({
    ...config,
    policy: { ...config.policy, tokens: [...config.policy.tokens, token] },
  }) as ServerConfig;
}
