// One zod schema for the whole config file, validated once and frozen. Every problem is reported
// with its path in the file so a newcomer can fix it without reading code.
import { readFileSync } from "node:fs";
import { dirname, isAbsolute, resolve } from "node:path";
import { z } from "zod";
import { PolicyConfigSchema } from "../policies/config.js";

const DeviceSchema = z
  .string()
  .regex(
    /^(auto|cpu|cuda|tpu|xla)(:\d{1,2})?$/,
    "use auto, cpu, cuda, tpu or xla, optionally with :index",
  );

export const ServerConfigSchema = z
  .object({
    /** Where SQLite stores (approvals, audit, jobs, reports) and generated files live. */
    data_dir: z.string().default(".data"),
    log_level: z
      .enum(["trace", "debug", "info", "warn", "error", "fatal", "silent"])
      .default("info"),
    /** Per-call timestamps for `npm run bench`'s decomposition, returned to callers that ask
     * with `_meta["tpu-mcp/trace"]`. Off by default: a measurement aid, not a feature. */
    trace_calls: z.boolean().default(false),
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
      })
      .strict()
      .prefault({}),
    runtime: z
      .object({
        python: z.string().default(".venv/bin/python"),
        catalog: z.string().default("runtime/catalog.builtin.json"),
        device: DeviceSchema.default("auto"),
        /** torch intra-op threads in the worker; 0 keeps torch's default (all cores). */
        threads: z.number().int().min(0).max(1024).default(0),
        /** eager: start the worker with the server; lazy: on the first call that needs it. */
        start: z.enum(["eager", "lazy"]).default("eager"),
        request_timeout_s: z.number().positive().max(86_400).default(600),
        heartbeat_interval_s: z.number().positive().default(5),
        heartbeat_timeout_s: z.number().positive().default(20),
        max_restarts: z.number().int().min(0).default(5),
        restart_window_s: z.number().positive().default(60),
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
      })
      .strict()
      .prefault({}),
    benchmark: z
      .object({
        max_configs: z.number().int().min(1).default(64),
        max_iterations: z.number().int().min(1).default(10_000),
        max_duration_s: z.number().positive().default(600),
      })
      .strict()
      .prefault({}),
    policy: PolicyConfigSchema.prefault({}),
  })
  .strict();

export type ServerConfig = z.infer<typeof ServerConfigSchema> & {
  /** Absolute paths derived from the file's location; filled by loadConfig. */
  readonly paths: { root: string; data_dir: string; catalog: string; python: string };
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
 * Parses a config object. `root` is the repository root (for the built-in catalog and venv);
 * relative paths in a config file are resolved against the file's own folder.
 */
export function parseConfig(raw: unknown, opts: { root: string; base?: string; source?: string }) {
  const parsed = ServerConfigSchema.safeParse(raw ?? {});
  if (!parsed.success) {
    const problems = parsed.error.issues.map(
      (i) => `${i.path.length ? i.path.join(".") : "(top level)"}: ${i.message}`,
    );
    throw new ConfigError(opts.source ?? "(inline)", problems);
  }
  const c = parsed.data;
  const base = opts.base ?? opts.root;
  const abs = (p: string, from: string) => (isAbsolute(p) ? p : resolve(from, p));
  // Defaults point inside the repository; values the user wrote are relative to their file.
  const fromRoot = (key: "catalog" | "python") =>
    (raw as any)?.runtime?.[key] !== undefined
      ? abs(c.runtime[key], base)
      : abs(c.runtime[key], opts.root);
  // The device given on the command line overrides the file (applyOverrides put it in raw).
  const config: ServerConfig = {
    ...c,
    paths: {
      root: opts.root,
      data_dir:
        (raw as any)?.data_dir !== undefined ? abs(c.data_dir, base) : abs(c.data_dir, opts.root),
      catalog: fromRoot("catalog"),
      python: fromRoot("python"),
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
): ServerConfig {
  if (!file) return parseConfig(applyOverrides({}, overrides), { root, source: "(defaults)" });
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
  return parseConfig(applyOverrides(raw, overrides), { root, base: dirname(path), source: file });
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
