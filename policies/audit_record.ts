// An audit record: its fields, the one canonical text it is stored and hashed as, and the
// redaction that keeps bulky or sensitive arguments out of it. No storage here (audit.ts) and no
// chain (audit_chain.ts): both read records through these functions, so the stored and the hashed
// forms cannot drift apart.

import { canonicalJson } from "./digest.js";
import type { CostEstimate } from "./estimate.js";
import type { DecisionEvidence } from "./passkeys/evidence.js";

export type AuditOutcome =
  | "allowed"
  | "denied"
  | "approval_requested"
  | "approval_granted"
  | "approval_denied"
  | "approval_expired"
  | "executed"
  | "failed"
  /** A call the server stopped running by stopping itself (a kill): written when it starts again. */
  | "interrupted"
  /** The first record under a key: from here on every record is HMAC'd with that key. */
  | "chain_keyed"
  /** An alert rule fired (policies/alerts/): `code` is the rule's kind, `args.rule` its name. */
  | "alert"
  /** A principal was suspended (by an alert rule): every call refused principal_suspended. */
  | "suspended"
  /** A suspension was lifted by an operator (`approver`). */
  | "resumed";

export interface AuditRecord {
  time: string;
  principal: string;
  tool: string;
  args_digest: string | null;
  /** Arguments with bulky or sensitive fields replaced by summaries (see redactArgs). */
  args?: unknown;
  estimate?: CostEstimate | null;
  outcome: AuditOutcome;
  reason?: string;
  code?: string;
  duration_ms?: number;
  approval_id?: string;
  approver?: string;
  /**
   * How the approver proved the decision: "client_form" (answered the client's form: whoever
   * that was, the agent included), "token" (held an operator token) or "passkey" (signed it;
   * `evidence` then holds the assertion, re-verified by `tpu-mcp audit verify`).
   */
  assurance?: "client_form" | "token" | "passkey";
  evidence?: DecisionEvidence;
  /**
   * On an operator's decision: the SHA-256 of what the approver was shown of the request (the
   * canonical JSON of approval_shown.ts's payload, as the console, the CLI and the MCP App render it).
   */
  shown_sha256?: string;
  /** On chain_keyed records: the id of the key that chains the records from here on. */
  key_id?: string;
  /** The worker(s) of a pool the call ran on (comma-separated). */
  worker?: string;
  /** The call's OpenTelemetry trace and SERVER span (hex), when spans were exported. */
  trace_id?: string;
  span_id?: string;
  /**
   * On an aggregate of repeated refusals (audit_refusals.ts): how many refusals it stands for,
   * beyond the record at `first_seq` that opened its window; `since`/`until` are the times of the
   * first and last of them, `tools` how many each tool got.
   */
  count?: number;
  first_seq?: number;
  since?: string;
  until?: string;
  tools?: Record<string, number>;
}

export interface StoredAuditRecord extends AuditRecord {
  seq: number;
  prev_hash: string;
  hash: string;
}

/** A record made ready to chain: undefined members dropped, each member formatted once. */
export interface PreparedRecord {
  clean: AuditRecord;
  /** Canonical `"name":value` texts of its members, sorted by name (no `seq`). */
  members: string[];
  /** Where `"seq":N` sorts among them. */
  seqAt: number;
}

/** Throws (PolicyError) for a record with no JSON form, before it can join a batch. */
export function prepareRecord(record: AuditRecord): PreparedRecord {
  const clean = withoutUndefined(record) as AuditRecord;
  const rec = clean as unknown as Record<string, unknown>;
  const keys = Object.keys(rec).filter((k) => k !== "seq");
  keys.sort();
  const members = keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(rec[k])}`);
  const seqAt = keys.findIndex((k) => k > "seq");
  return { clean, members, seqAt: seqAt === -1 ? keys.length : seqAt };
}

/**
 * The canonical JSON of a prepared record as stored, and with `seq` in its sorted place as
 * hashed: the same text `canonicalJson({...record, seq})` (keyedChainHash, verify) writes.
 */
export function canonicalWithSeq(
  p: PreparedRecord,
  seq: number,
): { stored: string; hashed: string } {
  const withSeq = [...p.members];
  withSeq.splice(p.seqAt, 0, `"seq":${seq}`);
  return { stored: `{${p.members.join(",")}}`, hashed: `{${withSeq.join(",")}}` };
}

/** A copy without undefined members (what JSON would keep), so stored and hashed forms agree. */
function withoutUndefined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map((x) => (x === undefined ? null : withoutUndefined(x)));
  if (v && typeof v === "object" && !(v instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v)) {
      const x = (v as Record<string, unknown>)[k];
      if (x !== undefined) out[k] = withoutUndefined(x);
    }
    return out;
  }
  return v;
}

function summarise(v: unknown): unknown {
  if (typeof v === "string") return { redacted: true, chars: v.length };
  if (Array.isArray(v)) {
    if (v.every((x) => typeof x === "string")) {
      return {
        redacted: true,
        count: v.length,
        total_chars: v.reduce((s: number, x: string) => s + x.length, 0),
      };
    }
    const shapes = v.slice(0, 16).map((x) => {
      const t = (x ?? {}) as Record<string, unknown>;
      return Array.isArray(t.shape)
        ? { dtype: t.dtype ?? null, shape: t.shape }
        : { type: typeof x };
    });
    return { redacted: true, count: v.length, items: shapes };
  }
  if (v && typeof v === "object") {
    const t = v as Record<string, unknown>;
    if (Array.isArray(t.shape)) return { redacted: true, dtype: t.dtype ?? null, shape: t.shape };
    return { redacted: true, keys: Object.keys(t).length };
  }
  return { redacted: true };
}

/** Replaces the named arguments (at any depth) with length/shape summaries. */
export function redactArgs(args: unknown, names: readonly string[]): unknown {
  const set = new Set(names);
  const walk = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === "object" && !ArrayBuffer.isView(v)) {
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
        if (x === undefined) continue;
        out[k] = set.has(k) ? summarise(x) : walk(x);
      }
      return out;
    }
    if (ArrayBuffer.isView(v)) return { redacted: true, bytes: v.byteLength };
    return v;
  };
  return walk(args);
}
