// Operator commands that work beside a running server, on the same SQLite store:
// `tpu-mcp approvals ...` and `tpu-mcp audit ...`. The operator is identified by a token checked
// against the same config as the server's HTTP callers. The commands that only read (approvals
// list/show, audit tail/head/verify/export) open the store read-only and never create it or the audit
// key: on a fresh data directory they answer as an empty store would, and say so on stderr.
import { closeSync, openSync, readFileSync, writeSync } from "node:fs";
import type { Logger } from "pino";
import type { ApprovalRecord, ApprovalStatus } from "../../policies/approval_record.js";
import { shownApproval, shownSha256 } from "../../policies/approval_shown.js";
import type { AuditHead, AuditTrail } from "../../policies/audit.js";
import { parseSince, type ExportFormat } from "../../policies/audit_export.js";
import { readAuditKey, type AuditKey } from "../../policies/audit_key.js";
import { verifySignedDecisions } from "../../policies/passkeys/verify_trail.js";
import { costNote } from "../../policies/limits/pricing.js";
import { createPolicyServices } from "../app/build_policies.js";
import { readApprovals, readAuditTrail } from "../app/storage.js";
import type { ServerConfig } from "../config/config.js";
import { terminalField } from "../terminal.js";
import { principalOfToken } from "./token.js";

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  json: boolean;
  logger: Logger;
}

/** Three lines per approval; each line passes terminalField, so a caller's text stays inside it. */
/** The record with what an approver is shown of it and that payload's hash (JSON output). */
function withShown(a: ApprovalRecord) {
  const shown = shownApproval(a);
  return { ...a, shown, shown_sha256: shownSha256(shown) };
}

function describe(a: ApprovalRecord): string {
  // The request as every approver sees it (approval_shown.ts); its decision's audit keeps the hash.
  const shown = shownApproval(a);
  const e = shown.estimate;
  const est = e
    ? ` estimate: ${e.device_seconds.toFixed(1)} device-s${costNote(e)}, ${(e.memory_bytes / 2 ** 20).toFixed(0)} MiB memory, ${(e.weight_bytes / 2 ** 20).toFixed(0)} MiB weights`
    : "";
  const decided = a.decided_by
    ? `  ${a.status === "denied" ? "denied" : "decided"} by ${a.decided_by}${a.reason ? `: ${a.reason}` : ""}`
    : "";
  return [
    `${shown.approval_id}  ${a.status.padEnd(8)} ${shown.requested_by} → ${shown.tool}  expires ${a.expires_at}${decided}`,
    `    args: ${JSON.stringify(shown.args)}`,
    `   ${est}`,
    `    rule: ${shown.rule ?? "(not recorded)"}  shown sha256: ${shownSha256(shown)}`,
  ]
    .map(terminalField)
    .join("\n");
}

/** Paging of `approvals list`: pending first (all of them, page by page), then the rest. */
export interface ListPaging {
  limit?: number;
  offset?: number;
  status?: ApprovalStatus;
}

const STATUSES: readonly ApprovalStatus[] = ["pending", "approved", "denied", "used", "expired"];

export async function runApprovalsCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io & { token?: string; reason?: string; paging?: ListPaging },
): Promise<number> {
  const [sub, id] = positionals;
  const paging = io.paging ?? {};
  const bad =
    (paging.limit !== undefined && !(Number.isInteger(paging.limit) && paging.limit > 0)) ||
    (paging.offset !== undefined && !(Number.isInteger(paging.offset) && paging.offset >= 0)) ||
    (paging.status !== undefined && !STATUSES.includes(paging.status));
  if (bad) {
    io.err(
      `approvals list: --limit needs a positive integer, --offset a non-negative one, --status one of ${STATUSES.join(", ")}`,
    );
    return 2;
  }
  if (sub === "list" || (sub === "show" && id)) return showApprovals(config, sub, id, io, paging);
  if ((sub === "approve" || sub === "deny") && id) return decide(config, sub, id, io);
  io.err(
    "usage: tpu-mcp approvals list [--limit N] [--offset N] [--status S] | show ID | approve ID | deny ID [--reason R] [--token T]",
  );
  return 2;
}

/** `approvals list | show ID`: read-only; never makes the store or the audit key. */
async function showApprovals(
  config: ServerConfig,
  sub: "list" | "show",
  id: string | undefined,
  io: Io,
  paging: ListPaging,
): Promise<number> {
  const store = await readApprovals(config, io.err);
  const { approvals } = store;
  try {
    if (sub === "list") {
      const page = await approvals.page({ ...paging, limit: paging.limit ?? 100 });
      // JSON is an array of this page's approvals (the page's cursor is not in it).
      if (io.json) {
        io.out(JSON.stringify(page.items.map(withShown), null, 2));
        return 0;
      }
      const shown = page.items.length;
      const total = paging.status ? undefined : page.pending_total + page.history_total;
      if (total === 0) {
        io.out("no approvals");
        return 0;
      }
      io.out(
        `${page.pending_total} pending (listed first, soonest to expire first), ${page.history_total} decided or expired` +
          (shown
            ? `; showing ${page.offset + 1}-${page.offset + shown}`
            : "; nothing on this page") +
          (paging.status ? ` with status ${paging.status}` : ""),
      );
      if (shown) io.out(page.items.map(describe).join("\n"));
      if (total !== undefined && page.offset + shown < total)
        io.out(
          `more: tpu-mcp approvals list --offset ${page.offset + shown} --limit ${page.limit}`,
        );
      return 0;
    }
    const a = await approvals.get(id!);
    if (!a) {
      io.err(`no approval ${id}`);
      return 1;
    }
    io.out(io.json ? JSON.stringify(withShown(a), null, 2) : describe(a));
    return 0;
  } finally {
    await store.close();
  }
}

/** Where this command looked: a server with another --home or --config keeps its own approvals. */
function notHere(config: ServerConfig): string {
  return ` This command read the approvals in ${config.paths.data_dir}; a server started with another --home or --config keeps its own: run the command its approval message prints, which names both.`;
}

/** `approvals approve|deny ID`: a decision is written and audited, as the server would. */
async function decide(
  config: ServerConfig,
  sub: "approve" | "deny",
  id: string,
  io: Io & { token?: string; reason?: string },
): Promise<number> {
  const approver = await principalOfToken(
    config,
    io,
    "an operator token is required: --token TOKEN or TPU_MCP_TOKEN (a principal with approvals:grant)",
  );
  if (typeof approver === "number") return approver;
  const policy = await createPolicyServices(config, io.logger);
  try {
    const rec = await policy.gate.decideApproval(id, approver, sub, io.reason);
    io.out(
      io.json
        ? JSON.stringify(rec, null, 2)
        : `${sub === "approve" ? "approved" : "denied"}: ${describe(rec)}`,
    );
    return 0;
  } catch (e) {
    const err = e as { code?: string; message?: string };
    io.err(
      `${err.code ?? "error"}: ${err.message}${err.code === "approval_not_found" ? notHere(config) : ""}`,
    );
    return 1;
  } finally {
    await policy.close();
  }
}

export async function runAuditCommand(
  config: ServerConfig,
  positionals: string[],
  io: Io & { n: number; head?: string; since?: string; format?: string; outFile?: string },
): Promise<number> {
  let key;
  try {
    // Read only: a missing key is reported by verify, never made here.
    key = readAuditKey(config.paths.audit_key);
  } catch (e) {
    io.err((e as Error).message);
    return 2;
  }
  let store: Awaited<ReturnType<typeof openAudit>>;
  try {
    store = await openAudit(config, key, io);
  } catch (e) {
    io.err(`TAMPERED or misconfigured: ${(e as Error).message}`);
    return 1;
  }
  const { audit } = store;
  try {
    const [sub] = positionals;
    if (sub === "tail") {
      const recs = await audit.tail(Number.isInteger(io.n) && io.n > 0 ? io.n : 20);
      if (io.json) io.out(JSON.stringify(recs, null, 2));
      else
        for (const r of recs) {
          // One line per record: a reason holding an argument name a caller chose stays on it.
          io.out(
            terminalField(
              `#${r.seq} ${r.time} ${r.principal} ${r.tool} ${r.outcome}${r.code ? ` (${r.code})` : ""}${r.count !== undefined ? ` ×${r.count} more after #${r.first_seq}` : ""}${r.duration_ms !== undefined ? ` ${r.duration_ms} ms` : ""}${r.reason ? ` — ${r.reason}` : ""}`,
            ),
          );
        }
      return 0;
    }
    if (sub === "head") {
      // One JSON line, to keep somewhere the database's writers cannot reach.
      // export_hash: the keyless chain's head, what a receiver of `audit export` checks against.
      io.out(
        JSON.stringify({ ...(await audit.exportHead()), exported_at: new Date().toISOString() }),
      );
      return 0;
    }
    // Awaited here, so the store is closed only after the export (the finally below).
    if (sub === "export") return await exportCommand(audit, io);
    if (sub === "verify") {
      let head: AuditHead | undefined;
      if (io.head !== undefined) {
        try {
          head = parseHead(readFileSync(io.head, "utf8"));
        } catch (e) {
          io.err(`--head ${io.head}: ${(e as Error).message}`);
          return 2;
        }
      }
      const v = await audit.verify({ head });
      // Then every passkey-signed decision, against the enrolled public keys (collected first:
      // the credential reads share the connection the records would be streamed on).
      const decisions = [];
      for await (const d of audit.signedDecisions()) decisions.push(d);
      const signed = await verifySignedDecisions(decisions, store.passkeys);
      if (io.json) io.out(JSON.stringify({ ...v, signed_decisions: signed }, null, 2));
      else {
        io.out(
          v.ok
            ? terminalField(`ok: ${v.checked} record(s), chain intact — ${v.reason}`)
            : terminalField(`TAMPERED at record #${v.first_bad_seq}: ${v.reason}`),
        );
        io.out(
          signed.ok
            ? `ok: ${signed.checked} passkey-signed decision(s) verified against the enrolled passkeys`
            : terminalField(
                `SIGNATURE CHECK FAILED for ${signed.failures.length} of ${signed.checked} passkey-signed decision(s): ` +
                  signed.failures
                    .map((f) => `#${f.seq} (${f.approval_id}): ${f.reason}`)
                    .join("; "),
              ),
        );
      }
      return v.ok && signed.ok ? 0 : 1;
    }
    io.err(
      "usage: tpu-mcp audit tail [-n N] | head | verify [--head FILE] | export --since SEQ|TIME [--format jsonl|ocsf] [--out FILE] | verify-export FILE --head HASH",
    );
    return 2;
  } finally {
    await store.close();
  }
}

/** `audit export`: to --out FILE (written in 1 MiB chunks) or stdout; the head on stderr. */
async function exportCommand(
  audit: AuditTrail,
  io: Io & { since?: string; format?: string; outFile?: string },
): Promise<number> {
  const format = (io.format ?? "jsonl") as ExportFormat;
  if (format !== "jsonl" && format !== "ocsf") {
    io.err(`--format ${io.format}: use jsonl or ocsf`);
    return 2;
  }
  if (io.since === undefined) {
    io.err("audit export needs --since SEQ|ISO-TIME (--since 1: the whole trail)");
    return 2;
  }
  let since: number | string;
  try {
    since = parseSince(io.since);
  } catch (e) {
    io.err((e as Error).message);
    return 2;
  }
  const fd = io.outFile !== undefined ? openSync(io.outFile, "w", 0o600) : null;
  let pending: string[] = [];
  let size = 0;
  const flush = () => {
    if (fd === null) for (const l of pending) io.out(l);
    else writeSync(fd, pending.join("\n") + "\n");
    pending = [];
    size = 0;
  };
  try {
    const s = await audit.export({ since, format }, (line) => {
      pending.push(line);
      size += line.length;
      if (size >= 1 << 20) flush();
    });
    flush();
    io.err(
      s.records === 0
        ? `no records from ${io.since} on; head #${s.head.seq} export_hash ${s.head.export_hash}`
        : `exported records ${s.first_seq}..${s.head.seq} (${s.records}); head #${s.head.seq} export_hash ${s.head.export_hash}` +
            " — hand the receiver this head out of band (or `tpu-mcp audit head`)",
    );
    return 0;
  } finally {
    if (fd !== null) closeSync(fd);
  }
}

/** The audit trail read-only (server/app/storage.ts): never made here. */
function openAudit(config: ServerConfig, key: AuditKey | null, io: Io) {
  return readAuditTrail(config, { key, logger: io.logger }, io.err);
}

/** A head exported by `tpu-mcp audit head` (the last JSON line of the file). */
function parseHead(text: string): AuditHead {
  const line = text.trim().split("\n").pop() ?? "";
  let h: Record<string, unknown>;
  try {
    h = JSON.parse(line);
  } catch {
    throw new Error("not the output of `tpu-mcp audit head` (not JSON)");
  }
  if (
    !Number.isInteger(h.seq) ||
    (h.seq as number) < 0 ||
    typeof h.hash !== "string" ||
    !/^[0-9a-f]{64}$/.test(h.hash)
  )
    throw new Error("not the output of `tpu-mcp audit head` (needs an integer seq and a hash)");
  return {
    seq: h.seq as number,
    hash: h.hash,
    time: typeof h.time === "string" ? h.time : null,
    key_id: typeof h.key_id === "string" ? h.key_id : null,
  };
}
