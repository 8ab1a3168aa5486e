// The `policy` section of the server config: one zod schema, defaults such that `{}` is valid.
// Tokens are stored as sha256 hashes only; `hashToken` is what the CLI uses to produce them.
// Tool names and per-tool defaults come from the tools' own records (ToolPolicy), which the
// server passes in: policyConfigSchema(tools).

import { createHash } from "node:crypto";
import { z } from "zod";
import { DEFAULT_STDIO_SCOPES, SCOPES } from "./scopes.js";
import { DEVICE_KINDS } from "../lib/device.js";
import type { ToolPolicy } from "./tool_policy.js";

const ScopeSchema = z.enum(SCOPES);
const PositiveInt = z.number().int().positive();
const NonNegative = z.number().nonnegative();

/** One per-tool fact as a record of the tools that set it (null: the section's default applies). */
function perTool<K extends "concurrency" | "timeoutS">(
  tools: readonly ToolPolicy[],
  key: K,
): Record<string, number> {
  const out: Record<string, number> = {};
  for (const t of tools) if (t[key] !== null) out[t.name] = t[key] as number;
  return out;
}

function withMode(tools: readonly ToolPolicy[], mode: ToolPolicy["deviceMode"]): string[] {
  return tools.filter((t) => t.deviceMode === mode).map((t) => t.name);
}

const StdioPrincipalSchema = z.object({
  id: z.string().min(1).default("local-user"),
  scopes: z.array(ScopeSchema).default([...DEFAULT_STDIO_SCOPES]),
});

/** `jwt:` names JWT principals (policies/auth.ts): a static id cannot take that namespace. */
const PrincipalIdSchema = z
  .string()
  .min(1)
  .max(256)
  .refine((id) => !id.startsWith("jwt:"), "ids starting with jwt: are JWT principals (jwt:<sub>)")
  .refine((id) => !/[\u0000-\u001f\u007f-\u009f]/.test(id), "no control characters in an id");

const TokenSchema = z.object({
  id: PrincipalIdSchema,
  token_sha256: z
    .string()
    .regex(/^[0-9a-fA-F]{64}$/, "token_sha256 must be 64 hex characters (sha256 of the token)")
    .transform((s) => s.toLowerCase()),
  scopes: z.array(ScopeSchema),
  expires_at: z.iso.datetime({ offset: true }).optional(),
});

const JwksSchema = z.object({ keys: z.array(z.record(z.string(), z.unknown())).min(1) });

const JwtSchema = z
  .object({
    issuer: z.string().min(1),
    audience: z.string().min(1),
    jwks_url: z.url().optional(),
    jwks: JwksSchema.optional(),
    scope_claim: z.string().min(1).default("scope"),
    clock_tolerance_s: NonNegative.default(30),
  })
  .refine((j) => (j.jwks_url === undefined) !== (j.jwks === undefined), {
    message: "jwt needs exactly one of jwks_url or jwks",
  });

function limitsSchema(tools: readonly ToolPolicy[], ToolSchema: z.ZodType<string>) {
  const concurrency = perTool(tools, "concurrency");
  const timeouts = perTool(tools, "timeoutS");
  return z.object({
    per_tool_concurrency: z
      .partialRecord(ToolSchema, PositiveInt)
      .default({})
      .transform((r) => ({ ...concurrency, ...r }) as Record<string, number>),
    default_concurrency: PositiveInt.default(8),
    /** Waiting calls allowed per tool beyond the running ones; the next one is refused `busy`. */
    queue_bound: z
      .partialRecord(ToolSchema, z.number().int().nonnegative())
      .default({})
      .transform((r) => r as Record<string, number>),
    default_queue_bound: z.number().int().nonnegative().default(16),
    /** Tools that hold their device alone (a writer lock on the device). */
    device_exclusive_tools: z.array(ToolSchema).default(withMode(tools, "exclusive")),
    /** Tools that share their device with each other (readers), never with an exclusive tool. */
    device_shared_tools: z.array(ToolSchema).default(withMode(tools, "shared")),
    device_queue_bound: z.number().int().nonnegative().default(64),
    call_timeout_s: z
      .partialRecord(ToolSchema, z.number().positive())
      .default({})
      .transform((r) => ({ ...timeouts, ...r }) as Record<string, number>),
    default_call_timeout_s: z.number().positive().default(60),
    rate_limit: z.object({ per_principal_per_minute: PositiveInt.default(120) }).prefault({}),
    /**
     * Calls of tools that can become jobs (load_model, run_benchmark) not done this many seconds
     * after the request arrived (queued or waiting for an approval included) answer with a job_id
     * instead of holding the request open; 0 = never.
     */
    soft_deadline_s: z.number().nonnegative().default(45),
    budget: z
      .object({
        device_seconds_per_window: z.number().positive().default(3600),
        window_s: z.number().positive().default(3600),
        /**
         * Device-seconds per window a principal may spend through read-scoped tools (check_model),
         * on top of being charged to its budget: a reader cannot take the device for long.
         */
        read_device_seconds_per_window: z.number().nonnegative().default(30),
        /**
         * The principal's budget in money (the `pricing` currency) per window instead of
         * device-seconds: its line is metered and capped at each call's device-kind price, and
         * device_seconds_per_window no longer applies to it. Needs `pricing`.
         */
        money_per_window: z.number().positive().optional(),
      })
      .prefault({}),
  });
}

const Price = z.number().positive().finite();
const PricesByKind = z.partialRecord(z.enum(DEVICE_KINDS), Price).default({});

/**
 * Device time in money (policies/limits/pricing.ts): estimates, charges, budget lines, approval
 * cards, webhooks, the console and benchmark reports show money beside device-seconds.
 */
const PricingSchema = z
  .object({
    currency: z
      .string()
      .regex(/^[A-Z]{3}$/, "an ISO 4217 currency code in capitals, e.g. USD or EUR"),
    per_device_second: PricesByKind,
    per_chip_hour: PricesByKind,
  })
  .superRefine((p, ctx) => {
    for (const kind of Object.keys(p.per_chip_hour)) {
      if (kind in p.per_device_second)
        ctx.addIssue({
          code: "custom",
          path: ["per_chip_hour", kind],
          message: `${kind} is priced twice (per_device_second and per_chip_hour); keep one`,
        });
    }
    if (Object.keys(p.per_chip_hour).length + Object.keys(p.per_device_second).length === 0)
      ctx.addIssue({
        code: "custom",
        path: ["per_chip_hour"],
        message: `give a price for at least one device kind (${DEVICE_KINDS.join(", ")})`,
      });
  })
  .transform((p) => ({
    currency: p.currency,
    per_device_second: p.per_device_second as Record<string, number>,
    per_chip_hour: p.per_chip_hour as Record<string, number>,
  }));

/** What a decision may be worth, weakest first (approval_record.ts has the type). */
const ASSURANCES = ["client_form", "token", "passkey"] as const;

function approvalRuleSchema(ToolOrAnySchema: z.ZodType<string>) {
  return z.object({
    tool: ToolOrAnySchema,
    /** Principal ids the rule applies to; absent = any principal. */
    principals: z.array(z.string().min(1)).optional(),
    /** Thresholds on the estimate; the rule applies when ANY is met. Absent = always. */
    when: z
      .object({
        min_weight_bytes: NonNegative.optional(),
        min_device_seconds: NonNegative.optional(),
        min_memory_bytes: NonNegative.optional(),
      })
      .optional(),
    /**
     * What a decision on this rule's approvals must prove: "token" (anyone holding an operator
     * token: CLI, API, token console session), "passkey" (a WebAuthn assertion, user verified,
     * bound to the exact call; policies/passkeys/), or "client_form": whoever answers the
     * client's form decides too (in band), which is the agent itself wherever it answers its
     * own client's prompts. Only this value lets an in-band answer decide; an operator may still
     * decide such an approval out of band.
     */
    assurance: z.enum(ASSURANCES).default("token"),
  });
}

/** Operators' passkeys (policies/passkeys/): enrolment and which authenticators are accepted. */
const PasskeysSchema = z
  .object({
    /** How long a code printed by `tpu-mcp operators enrol NAME` can be used. */
    enrolment_code_ttl_s: z.number().positive().max(3600).default(600),
    /** How long a ceremony's challenge (sign-in, decision, enrolment) can be answered. */
    challenge_ttl_s: z.number().positive().max(900).default(120),
    /**
     * Authenticator models (AAGUIDs, from the attestation) accepted at enrolment; absent: any.
     * Setting it asks authenticators for direct attestation.
     */
    allowed_aaguids: z
      .array(
        z
          .string()
          .regex(/^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$/, "an AAGUID (a UUID)")
          .transform((s) => s.toLowerCase()),
      )
      .optional(),
  })
  .strict();

/** A webhook for approval events (policies/notify.ts has the wire format). */
const NotifySchema = z
  .object({
    url: z.url({ protocol: /^https?$/, error: "url must be an http:// or https:// URL" }),
    /** A file holding the HMAC secret (at least 16 bytes); relative to the config file. */
    secret_file: z.string().min(1),
    events: z
      .array(z.enum(["requested", "decided"]))
      .min(1)
      .default(["requested", "decided"]),
  })
  .strict();

/**
 * The rules that apply when the config names none: costly work asks a human (secure by default).
 * They are data, printed by `tpu-mcp config show`; a config's own `rules` replace them, and
 * `"rules": []` given explicitly is how approvals are turned off (the server warns at start-up).
 * - every run_benchmark: it holds the device for its whole grid;
 * - load_model of weights from 1 GiB (the built-in models are at most 91 MB and load without
 *   asking; a model of ~250M float32 or ~500M bfloat16 parameters and up asks);
 * - check_model estimated at 30 device-seconds or more (the read allowance a reader may spend
 *   per window; a check of a built-in model is about a second, one loading gigabytes asks).
 */
export const DEFAULT_APPROVAL_RULES: readonly {
  tool: string;
  when?: { min_weight_bytes?: number; min_device_seconds?: number };
}[] = [
  { tool: "run_benchmark" },
  { tool: "load_model", when: { min_weight_bytes: 2 ** 30 } },
  { tool: "check_model", when: { min_device_seconds: 30 } },
];

function approvalsSchema(rule: ReturnType<typeof approvalRuleSchema>, names: readonly string[]) {
  // Only the defaults for tools this server has (a test may build the schema for a few).
  const defaults = DEFAULT_APPROVAL_RULES.filter((r) => names.includes(r.tool));
  return z.object({
    // Token assurance: with no config there is no passkey yet (an operator enrols one later).
    rules: z
      .array(rule)
      .default(() => defaults.map((r) => ({ assurance: "token" as const, ...structuredClone(r) }))),
    notify: z.array(NotifySchema).max(16).default([]),
    ttl_s: z.number().positive().default(900),
    /** Pending requests one principal may hold; one more is refused `approval_limit`. */
    max_pending_per_principal: PositiveInt.default(20),
    /** How long an approval is kept after it is over (counted from its expiry), then deleted. */
    keep_decided_s: NonNegative.default(7 * 86_400),
    /**
     * Whether to ask in band at all (an elicitation in 2025, input_required in 2026-07-28). Only
     * rules of `"assurance": "client_form"` are ever asked; false asks none of them either.
     */
    elicitation: z.boolean().default(true),
    elicitation_timeout_s: z.number().positive().default(300),
    /**
     * An approved call is stopped (approval_overrun) once its device time passes its approved
     * estimate times this; 0 turns the bound off. Estimates err both ways (docs: p90 ~2× with
     * history), so the default leaves that much room.
     */
    overrun_factor: NonNegative.default(2),
    /**
     * …and past it by at least this many seconds: a 0.25 s estimate on a loaded 2-core host may
     * take a few seconds without anyone having approved more than they saw.
     */
    overrun_min_s: NonNegative.default(30),
  });
}

/** An alert rule's name: it keys the once-per-window latch and shows in webhooks and on the console page. */
const AlertNameSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_.-]{0,63}$/, "a name of lower-case letters, digits, _ . - (64 at most)");

/** What a rule does beyond the log line, the webhook and the console (which every rule does). */
const AlertActionSchema = {
  /** "suspend": the principal is refused every call (principal_suspended), its running calls stopped. */
  action: z.enum(["notify", "suspend"]).default("notify"),
  /** How long a suspension lasts; 0: until an operator runs `tpu-mcp principals resume ID`. */
  suspend_s: NonNegative.default(900),
};

/** The rules over what the gate counts (policies/alerts/); docs/policies-and-approvals.md. */
const AlertRuleSchema = z.discriminatedUnion("kind", [
  z
    .object({
      name: AlertNameSchema,
      /** Refused calls of one principal (any code but principal_suspended) within window_s. */
      kind: z.literal("refusals"),
      threshold: PositiveInt,
      window_s: z.number().positive().default(60),
      ...AlertActionSchema,
    })
    .strict(),
  z
    .object({
      name: AlertNameSchema,
      /** A principal's device-seconds in its budget window reached `percent` of its budget. */
      kind: z.literal("budget"),
      percent: z.number().positive().max(100),
      ...AlertActionSchema,
    })
    .strict(),
  z
    .object({
      name: AlertNameSchema,
      /** An approval request still pending `after_s` after it was made. */
      kind: z.literal("approval_waiting"),
      after_s: z.number().positive(),
    })
    .strict(),
  z
    .object({
      name: AlertNameSchema,
      /** A worker restarted `threshold` times within window_s (a crash loop in the making). */
      kind: z.literal("worker_restarts"),
      threshold: PositiveInt,
      window_s: z.number().positive().default(600),
    })
    .strict(),
]);

/**
 * The alert rules that apply when the config names none (printed by `tpu-mcp config show`); a
 * config's own `rules` replace them, `"rules": []` turns alerts off.
 * - refusal-flood: 1,000 refused calls of one principal within a minute suspend it for 15 min
 *   (a well-behaved agent at the default 120 calls/min cannot get there; one ignoring its
 *   refusals does within seconds);
 * - budget-80: a principal reached 80 % of its device-time budget;
 * - approval-waiting: an approval request has waited 10 min for an operator (of the 15 it lives);
 * - worker-crash-loop: a worker restarted 3 times in 10 min.
 */
export const DEFAULT_ALERT_RULES = [
  {
    name: "refusal-flood",
    kind: "refusals",
    threshold: 1000,
    window_s: 60,
    action: "suspend",
    suspend_s: 900,
  },
  { name: "budget-80", kind: "budget", percent: 80, action: "notify", suspend_s: 900 },
  { name: "approval-waiting", kind: "approval_waiting", after_s: 600 },
  { name: "worker-crash-loop", kind: "worker_restarts", threshold: 3, window_s: 600 },
] as const;

/** A webhook for alerts: signed as the approval webhooks are (policies/notify.ts). */
const AlertNotifySchema = z
  .object({
    url: z.url({ protocol: /^https?$/, error: "url must be an http:// or https:// URL" }),
    /** A file holding the HMAC secret (at least 16 bytes); relative to the config file. */
    secret_file: z.string().min(1),
  })
  .strict();

const AlertsSchema = z
  .object({
    rules: z
      .array(AlertRuleSchema)
      .default(() => structuredClone(DEFAULT_ALERT_RULES) as never)
      .superRefine((rules, ctx) => {
        const seen = new Set<string>();
        rules.forEach((r, i) => {
          if (seen.has(r.name))
            ctx.addIssue({
              code: "custom",
              path: [i, "name"],
              message: "two rules have this name",
            });
          seen.add(r.name);
        });
      }),
    notify: z.array(AlertNotifySchema).max(16).default([]),
    /** How often pending approvals are looked at (approval_waiting rules). */
    check_interval_s: z.number().positive().default(15),
  })
  .strict();

/** The streaming audit sink (policies/audit_sink.ts): a rotating file or an HTTP endpoint. */
const AuditSinkSchema = z
  .discriminatedUnion("kind", [
    z
      .object({
        kind: z.literal("file"),
        /** The file records are appended to (relative to the config file); rotated by size. */
        path: z.string().min(1),
        /** Rotated to `path.1` once it would pass this many bytes. */
        max_bytes: PositiveInt.default(64 * 2 ** 20),
        /** Rotated files kept (`path.1` … `path.N`). */
        keep: PositiveInt.max(100).default(5),
        max_queue: PositiveInt.default(10_000),
      })
      .strict(),
    z
      .object({
        kind: z.literal("http"),
        url: z.url({ protocol: /^https?$/, error: "url must be an http:// or https:// URL" }),
        /** Optional: each POST signed as the webhooks are, with this file's secret. */
        secret_file: z.string().min(1).optional(),
        /** Records per POST. */
        batch: PositiveInt.max(10_000).default(500),
        /** A POST not taken is sent again after this, doubling up to max_backoff_s. */
        retry_base_ms: PositiveInt.default(500),
        max_backoff_s: z.number().positive().default(30),
        /** Records that may wait while the endpoint is slow or down; more are dropped. */
        max_queue: PositiveInt.default(10_000),
      })
      .strict(),
  ])
  .optional();

const AuditSchema = z.object({
  /** Absent: no sink (the trail is read with `audit tail/search/export`). */
  sink: AuditSinkSchema,
  redact_args: z.array(z.string().min(1)).default(["texts", "messages", "tensors"]),
  /** The chain's HMAC key file (made 0600 at first start); default `<data_dir>/audit.key`. */
  key_file: z.string().min(1).optional(),
  /**
   * Repeats of a refusal within this many seconds of the first are counted into one aggregate
   * record (policies/audit_refusals.ts); 0 records every refusal on its own.
   */
  refusal_window_s: NonNegative.default(60),
});

/** The policy section's schema for these tools (names checked, per-tool defaults theirs). */
export function policyConfigSchema(tools: readonly ToolPolicy[]) {
  const names = tools.map((t) => t.name) as [string, ...string[]];
  // Tool names are checked so a typo in a rule cannot silently switch an approval off.
  const ToolSchema = z.enum(names, { error: `unknown tool; known tools: ${names.join(", ")}` });
  const ToolOrAnySchema = z.enum(["*", ...names] as [string, ...string[]], {
    error: `unknown tool; use one of ${names.join(", ")} or "*"`,
  });
  return z
    .object({
      stdio_principal: StdioPrincipalSchema.prefault({}),
      tokens: z.array(TokenSchema).default([]),
      jwt: JwtSchema.optional(),
      limits: limitsSchema(tools, ToolSchema).prefault({}),
      approvals: approvalsSchema(approvalRuleSchema(ToolOrAnySchema), names).prefault({}),
      audit: AuditSchema.prefault({}),
      alerts: AlertsSchema.prefault({}),
      passkeys: PasskeysSchema.prefault({}),
      pricing: PricingSchema.optional(),
    })
    .superRefine((c, ctx) => {
      if (c.limits.budget.money_per_window !== undefined && !c.pricing)
        ctx.addIssue({
          code: "custom",
          path: ["limits", "budget", "money_per_window"],
          message:
            "a budget in money needs prices: add a pricing section (currency and a price per device-second or per chip-hour for each device kind)",
        });
      const hashes = new Set<string>();
      c.tokens.forEach((t, i) => {
        if (hashes.has(t.token_sha256)) {
          ctx.addIssue({
            code: "custom",
            path: ["tokens", i, "token_sha256"],
            message: "two tokens have the same hash",
          });
        }
        hashes.add(t.token_sha256);
      });
    });
}

type PolicyConfigSchema = ReturnType<typeof policyConfigSchema>;
export type PolicyConfigInput = z.input<PolicyConfigSchema>;
export type PolicyConfig = z.output<PolicyConfigSchema>;
export type ApprovalRule = PolicyConfig["approvals"]["rules"][number];
export type StaticTokenConfig = PolicyConfig["tokens"][number];
export type JwtConfig = NonNullable<PolicyConfig["jwt"]>;
export type LimitsConfig = PolicyConfig["limits"];
export type PasskeysConfig = PolicyConfig["passkeys"];
export type Assurance = ApprovalRule["assurance"];
export type AlertsConfig = PolicyConfig["alerts"];
export type AuditSinkConfig = NonNullable<PolicyConfig["audit"]["sink"]>;
export type AlertRule = AlertsConfig["rules"][number];

/** Parses a policy section for these tools (throws zod's error with paths on invalid input). */
export function parsePolicyConfig(input: unknown, tools: readonly ToolPolicy[]): PolicyConfig {
  return policyConfigSchema(tools).parse(input ?? {});
}

export function hashToken(plain: string): string {
  return createHash("sha256").update(plain, "utf8").digest("hex");
}

// Per-tool lookups; the records above already merge the defaults under the configured values.
export function toolConcurrency(limits: LimitsConfig, tool: string): number {
  return limits.per_tool_concurrency[tool] ?? limits.default_concurrency;
}

export function toolQueueBound(limits: LimitsConfig, tool: string): number {
  return limits.queue_bound[tool] ?? limits.default_queue_bound;
}

export function toolTimeoutMs(limits: LimitsConfig, tool: string): number {
  const s = limits.call_timeout_s[tool] ?? limits.default_call_timeout_s;
  return Math.round(s * 1000);
}
