// Refusals a caller can repeat at will, counted instead of recorded one by one, so that the
// lowest-privilege token cannot fill the trail (issue 23: ~1,700 rate_limited records a second)
// while every refusal stays accountable.
//
// THE RULE (docs/security.md, "Repeated refusals"). A refusal that aggregates opens a window of
// `policy.audit.refusal_window_s` (60 s) for its key: the first refusal is recorded at once, in
// full; the repeats within the window only increment a count, written as ONE aggregate record
// (`count`, `first_seq`, `since`, `until`; `tools` for a rate window) when the window ends or the
// server closes — appended and hash-chained like every record. Sum `count` (1 for a record
// without it) over the denied records and you get the refusals.
//   - rate_limited and principal_suspended per principal (any tool, any arguments; a suspended
//     principal is refused before its rate), and insufficient_scope per principal
//     and tool (which tool was tried is worth a record; tools are a fixed set): the refusals made
//     at or before the rate step, which nothing else bounds;
//   - any other refusal of a call repeated with the same tool and argument digest, per
//     principal, code, tool and digest: the same call refused again says nothing new.
// Recorded one by one, always: allowed, executed and failed calls, every approval outcome and
// every approval_* refusal (an approval's story is read record by record), a refusal without an
// argument digest (two of them cannot be told apart), chain_keyed, and every refusal written
// through `append` instead of `appendRefusal` (the operator's approve/deny, worker trust). A
// refusal made outside the gate may name its key (`per`): failed authentication per address.
//
// The bound: per principal and window, rate_limited adds at most 2 records and
// insufficient_scope at most 2 per tool, whatever their number; every other record a principal
// causes comes from a call that got past its rate (per_principal_per_minute). A crash loses at
// most the counts of the open windows; their first refusals are already on disk.

import type { AuditRecord, StoredAuditRecord } from "./audit_record.js";

/** How a refusal's window is keyed: by principal, by principal and tool, or by the exact call. */
export type RefusalScope = "principal" | "tool" | "call";
type Scope = RefusalScope;

/** Distinct tools named in one aggregate; the rest are counted under "(other)". */
export const MAX_TOOLS = 32;
/** Windows open at once (memory); past it, refusals are recorded one by one again. */
export const MAX_OPEN = 10_000;

/**
 * The rule above; `per` is for refusals made outside the gate, whose caller knows what repeats
 * (e.g. failed authentication per client address: `per: "principal"` with the address as the
 * principal). It applies to denied records only.
 */
export function scopeOf(rec: AuditRecord, per?: Scope): Scope | null {
  if (rec.outcome !== "denied" || !rec.code) return null;
  if (per) return per === "call" && !rec.args_digest ? null : per;
  if (rec.code === "rate_limited" || rec.code === "principal_suspended") return "principal";
  if (rec.code === "insufficient_scope") return "tool";
  if (rec.code.startsWith("approval_") || !rec.args_digest) return null;
  return "call";
}

/** The window a refusal is counted in, or null when it is recorded on its own (see the rule). */
export function repeatKey(rec: AuditRecord, per?: Scope): string | null {
  const scope = scopeOf(rec, per);
  if (scope === null) return null;
  const key: unknown[] = [rec.principal, rec.code];
  if (scope !== "principal") key.push(rec.tool);
  if (scope === "call") key.push(rec.args_digest);
  return JSON.stringify(key);
}

interface Window {
  first: StoredAuditRecord;
  scope: Scope;
  endsAt: number;
  count: number;
  since?: string;
  until?: string;
  tools: Map<string, number>;
}

/** What an aggregate is made of: its window's first record, scope and counts. */
export interface WindowCounts {
  first: Pick<StoredAuditRecord, "principal" | "tool" | "args_digest" | "code" | "seq">;
  scope: Scope;
  count: number;
  since?: string;
  until?: string;
  /** Refusals per tool (at most MAX_TOOLS names, then "(other)"). */
  tools: ReadonlyMap<string, number>;
}

/**
 * The aggregate record of a window that counted repeats, written when it ends at `now` (every
 * backend writes this same record: SQLite below, Postgres server/stores/audit/postgres.ts).
 */
export function aggregateRecord(w: WindowCounts, windowMs: number, now: number): AuditRecord {
  const f = w.first;
  const tools = [...w.tools.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return {
    time: new Date(now).toISOString(),
    principal: f.principal,
    tool: w.scope !== "principal" ? f.tool : tools.length === 1 ? tools[0][0] : "*",
    args_digest: w.scope === "call" ? f.args_digest : null,
    outcome: "denied",
    code: f.code,
    count: w.count,
    first_seq: f.seq,
    since: w.since,
    until: w.until,
    ...(w.scope === "principal" ? { tools: Object.fromEntries(tools) } : {}),
    reason: `${w.count} more ${f.code} refusal(s) of ${f.principal} in the ${Math.round(windowMs / 1000)} s window opened by record #${f.seq}`,
  };
}

export interface RefusalWindowOptions {
  windowMs: number;
  now?: () => number;
  /** Where an aggregate that could not be appended goes (it still reaches the logs). */
  onLost?: (rec: AuditRecord, err: unknown) => void;
  onFull?: () => void;
  maxOpen?: number;
}

export class RefusalWindows {
  private readonly open = new Map<string, Window>();
  private timer?: NodeJS.Timeout;
  private readonly now: () => number;

  constructor(
    private readonly append: (rec: AuditRecord) => StoredAuditRecord,
    private readonly opts: RefusalWindowOptions,
  ) {
    this.now = opts.now ?? Date.now;
  }

  /** Records `rec` now (returns it stored) or counts it in its open window (returns null). */
  record(rec: AuditRecord, per?: Scope): StoredAuditRecord | null {
    const now = this.now();
    this.flushDue(now);
    const key = this.opts.windowMs > 0 ? repeatKey(rec, per) : null;
    const w = key === null ? undefined : this.open.get(key);
    if (w) {
      w.count++;
      w.since ??= rec.time;
      w.until = rec.time;
      const tool = w.tools.has(rec.tool) || w.tools.size < MAX_TOOLS ? rec.tool : "(other)";
      w.tools.set(tool, (w.tools.get(tool) ?? 0) + 1);
      return null;
    }
    const stored = this.append(rec);
    if (key === null) return stored;
    if (this.open.size >= (this.opts.maxOpen ?? MAX_OPEN)) {
      this.opts.onFull?.();
      return stored;
    }
    this.open.set(key, {
      first: stored,
      scope: scopeOf(rec, per)!,
      endsAt: now + this.opts.windowMs,
      count: 0,
      tools: new Map(),
    });
    this.schedule(now);
    return stored;
  }

  /** Ends the windows whose time is up, appending an aggregate for each that counted repeats. */
  flushDue(now = this.now()): void {
    for (const [key, w] of this.open) {
      // Windows open in time order and all last windowMs: the first still open ends the scan.
      if (w.endsAt > now) break;
      this.open.delete(key);
      this.emit(w, now);
    }
  }

  /** Ends every window now (the server is closing): no count is left unwritten. */
  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const now = this.now();
    const all = [...this.open.values()];
    this.open.clear();
    for (const w of all) this.emit(w, now);
  }

  /** Repeats counted but not yet written (tests read it). */
  pending(): number {
    let n = 0;
    for (const w of this.open.values()) n += w.count;
    return n;
  }

  private emit(w: Window, now: number): void {
    if (w.count === 0) return;
    const rec = aggregateRecord(w, this.opts.windowMs, now);
    try {
      this.append(rec);
    } catch (e) {
      this.opts.onLost?.(rec, e);
    }
  }

  /** One timer, at the end of the oldest open window; unref'd: close() writes what is left. */
  private schedule(now: number): void {
    if (this.timer) return;
    const first = this.open.values().next().value;
    if (!first) return;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.flushDue();
        this.schedule(this.now());
      },
      Math.max(0, first.endsAt - now),
    );
    this.timer.unref?.();
  }
}
