// The audit trail's contract: one list of cases every backend of AuditTrail (policies/audit.ts)
// must pass: SqliteAuditTrail (sqlite.ts) and PgAuditTrail (postgres.ts).
// A test file calls auditContract with a factory that opens an empty trail's storage;
// test/stores/audit.test.ts runs it on SQLite, test/postgres/contracts.test.ts on a real
// PostgreSQL. A tamperer is played through `raw`, the backend's rows as stored, so each case
// checks that the backend's verification finds what was done to its own tables.
import { describe, expect, it } from "vitest";
import type { AuditRecord, AuditTrail, PolicyLogger } from "../../../policies/audit.js";
import { chainHash, GENESIS_HASH, headMac, keyedChainHash } from "../../../policies/audit_chain.js";
import { ephemeralAuditKey, type AuditKey } from "../../../policies/audit_key.js";

/** One stored record, as the table holds it. */
export interface RawAuditRow {
  seq: number;
  record: string;
  prev_hash: string;
  hash: string;
}

/** The backend's tables, written as someone with write access to the database would. */
export interface AuditRaw {
  /** Every record, oldest first. */
  rows(): Promise<RawAuditRow[]>;
  /** Rewrites the record, prev_hash and hash of the row at `row.seq`. */
  update(row: RawAuditRow): Promise<void>;
  /** Deletes the rows with from <= seq <= to (to: the end). */
  remove(from: number, to?: number): Promise<void>;
  /** Replaces every row with `rows`. */
  replace(rows: RawAuditRow[]): Promise<void>;
  /** Rewrites the head row (`mac` undefined: left as it is). */
  setHead(head: { seq: number; hash: string; mac?: string | null }): Promise<void>;
  /** Deletes every record and empties the head. */
  wipe(): Promise<void>;
}

export interface AuditTrailOptions {
  key?: AuditKey | null;
  keyCreated?: boolean;
  logger?: PolicyLogger;
}

export interface AuditHandle {
  /** Opens a trail on this storage (another handle: another process or replica). */
  trail(opts?: AuditTrailOptions): Promise<AuditTrail>;
  raw: AuditRaw;
  /** Closes every trail the factory opened. */
  close(): Promise<void>;
}

export type OpenAudit = () => Promise<AuditHandle>;

const rec = (i: number, over: Partial<AuditRecord> = {}): AuditRecord => ({
  time: new Date(Date.UTC(2025, 0, 1, 0, 0, i)).toISOString(),
  principal: "agent",
  tool: "run_inference",
  args_digest: "ab".repeat(32),
  args: { model: "tiny-gpt2", texts: { redacted: true, count: 1 } },
  estimate: null,
  outcome: "executed",
  duration_ms: i,
  ...over,
});

interface Line {
  level: string;
  obj: object;
  msg?: string;
}

function captureLogger(): PolicyLogger & { lines: Line[] } {
  const lines: Line[] = [];
  const at = (level: string) => (obj: object, msg?: string) => void lines.push({ level, obj, msg });
  return { lines, info: at("info"), warn: at("warn"), error: at("error") };
}

async function appendAll(trail: AuditTrail, from: number, to: number): Promise<void> {
  for (let i = from; i <= to; i++) await trail.append(rec(i));
}

/** Rehashes every row from `from` on with `hash` (a tamperer's chain), and points the head at it. */
async function rechain(
  raw: AuditRaw,
  from: number,
  hash: (prev: string, seq: number, record: AuditRecord) => string,
  mac?: (seq: number, hash: string) => string,
): Promise<void> {
  const rows = await raw.rows();
  let prev = from === 1 ? GENESIS_HASH : rows.find((r) => r.seq === from - 1)!.hash;
  let last = from - 1;
  for (const r of rows.filter((x) => x.seq >= from)) {
    const h = hash(prev, r.seq, JSON.parse(r.record) as AuditRecord);
    await raw.update({ ...r, prev_hash: prev, hash: h });
    prev = h;
    last = r.seq;
  }
  await raw.setHead({ seq: last, hash: prev, mac: mac?.(last, prev) });
}

/** The record at `seq` with "agent" replaced by "someone-else". */
async function edit(raw: AuditRaw, seq: number): Promise<void> {
  const row = (await raw.rows()).find((r) => r.seq === seq)!;
  await raw.update({ ...row, record: row.record.replace('"agent"', '"someone-else"') });
}

export function auditContract(name: string, open: OpenAudit): void {
  describe(`AuditTrail contract: ${name}`, () => {
    it("chains records in the order appended and emits each as one log line", async () => {
      const { trail, close } = await open();
      const logger = captureLogger();
      const log = await trail({ logger });
      await appendAll(log, 1, 5);
      const tail = await log.tail(2);
      expect(tail.map((r) => r.seq)).toEqual([4, 5]);
      expect(tail[1]!.prev_hash).toBe(tail[0]!.hash);
      expect(tail.map((r) => r.duration_ms)).toEqual([4, 5]);
      expect(await log.verify()).toEqual({
        ok: true,
        checked: 5,
        reason: "5 records chain correctly",
      });
      expect(logger.lines.filter((l) => "audit" in l.obj)).toHaveLength(5);
      expect(logger.lines[0]!.obj).toMatchObject({ audit: { seq: 1, outcome: "executed" } });
      await close();
    });

    it("detects an edited record at its seq", async () => {
      const { trail, raw, close } = await open();
      const log = await trail();
      await appendAll(log, 1, 5);
      await edit(raw, 3);
      expect(await log.verify()).toMatchObject({ ok: false, checked: 2, first_bad_seq: 3 });
      await close();
    });

    it("detects a deleted record", async () => {
      const { trail, raw, close } = await open();
      const log = await trail();
      await appendAll(log, 1, 5);
      await raw.remove(2, 2);
      const v = await log.verify();
      expect(v).toMatchObject({ ok: false, first_bad_seq: 2 });
      expect(v.reason).toMatch(/missing/);
      await close();
    });

    it("detects records removed from the end", async () => {
      const { trail, raw, close } = await open();
      const log = await trail();
      await appendAll(log, 1, 5);
      await raw.remove(4);
      expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 4 });
      await close();
    });

    it("detects reordered records", async () => {
      const { trail, raw, close } = await open();
      const log = await trail();
      await appendAll(log, 1, 5);
      const rows = await raw.rows();
      const [a, b] = [rows[1]!, rows[2]!];
      await raw.update({ ...b, seq: a.seq });
      await raw.update({ ...a, seq: b.seq });
      expect(await log.verify()).toMatchObject({ ok: false, first_bad_seq: 2 });
      await close();
    });

    it("keeps one chain across two handles and a reopen", async () => {
      const { trail, close } = await open();
      const key = ephemeralAuditKey();
      const log = await trail({ key, keyCreated: true });
      await appendAll(log, 1, 2);
      const other = await trail({ key });
      await other.append(rec(3, { outcome: "approval_granted", approver: "operator" }));
      await log.append(rec(4));
      await log.close();
      await other.close();
      const reopened = await trail({ key });
      expect(await reopened.verify()).toMatchObject({ ok: true, checked: 5 });
      expect((await reopened.tail(10)).map((r) => r.outcome)).toEqual([
        "chain_keyed",
        "executed",
        "executed",
        "approval_granted",
        "executed",
      ]);
      await close();
    });

    it("starts a keyed trail with a chain_keyed record, and its head names the key", async () => {
      const { trail, close } = await open();
      const key = ephemeralAuditKey();
      const log = await trail({ key, keyCreated: true });
      await appendAll(log, 1, 3);
      expect((await log.tail(10))[0]).toMatchObject({
        seq: 1,
        outcome: "chain_keyed",
        key_id: key.id,
      });
      expect(await log.verify()).toMatchObject({ ok: true, checked: 4 });
      expect(await log.head()).toMatchObject({ seq: 4, key_id: key.id, time: rec(3).time });
      await close();
    });

    it("detects records truncated from the end with the head row rewritten to match", async () => {
      const { trail, raw, close } = await open();
      const log = await trail({ key: ephemeralAuditKey(), keyCreated: true });
      await appendAll(log, 1, 6);
      const exported = await log.head();
      const at4 = (await raw.rows()).find((r) => r.seq === 4)!;
      await raw.remove(5);
      await raw.setHead({ seq: 4, hash: at4.hash });
      const v = await log.verify();
      expect(v).toMatchObject({ ok: false, first_bad_seq: 4 });
      expect(v.reason).toMatch(/head row was rewritten/);
      // The head an operator exported before also shows it.
      expect((await log.verify({ head: exported })).ok).toBe(false);
      await close();
    });

    it("detects a wiped trail against the key, and a restart on it says so", async () => {
      const { trail, raw, close } = await open();
      const key = ephemeralAuditKey();
      const log = await trail({ key, keyCreated: true });
      await appendAll(log, 1, 4);
      await raw.wipe();
      const v = await log.verify();
      expect(v.ok).toBe(false);
      expect(v.reason).toMatch(/trail is empty, but the key .* exists/);
      const logger = captureLogger();
      const again = await trail({ key, keyCreated: false, logger });
      expect(
        logger.lines.some((l) => l.level === "error" && /audit trail reset/.test(l.msg!)),
      ).toBe(true);
      // An append after the wipe: SQLite makes a new head row and keeps writing the flagged
      // trail; Postgres refuses while its head row is missing. Neither verifies as intact.
      await again.append(rec(9)).catch((e) => expect(String(e)).toMatch(/tampered with/));
      expect(await again.verify()).toMatchObject({ ok: false });
      await close();
    });

    it("detects an edited record whose chain was recomputed without the key", async () => {
      const { trail, raw, close } = await open();
      const log = await trail({ key: ephemeralAuditKey(), keyCreated: true });
      await appendAll(log, 1, 5);
      await edit(raw, 3);
      await rechain(raw, 3, chainHash);
      const v = await log.verify();
      expect(v).toMatchObject({ ok: false, first_bad_seq: 3 });
      expect(v.reason).toMatch(/HMAC does not match/);
      await close();
    });

    it("detects an edited record whose chain and head were recomputed with the tamperer's key", async () => {
      const { trail, raw, close } = await open();
      const log = await trail({ key: ephemeralAuditKey(), keyCreated: true });
      await appendAll(log, 1, 5);
      const theirs = Buffer.alloc(32, 7);
      await edit(raw, 3);
      await rechain(
        raw,
        3,
        (prev, seq, r) => keyedChainHash(theirs, prev, seq, r),
        (seq, hash) => headMac(theirs, seq, hash),
      );
      const v = await log.verify();
      expect(v).toMatchObject({ ok: false, first_bad_seq: 3 });
      expect(v.reason).toMatch(/HMAC does not match/);
      await close();
    });

    it("detects a whole trail rewritten without the key (no chain_keyed record)", async () => {
      const { trail, raw, close } = await open();
      const key = ephemeralAuditKey();
      const log = await trail({ key, keyCreated: true });
      await appendAll(log, 1, 3);
      const rows = (await raw.rows()).slice(1).map((r) => ({ ...r, seq: r.seq - 1 }));
      await raw.replace(rows);
      await rechain(raw, 1, chainHash);
      const v = await log.verify();
      expect(v.ok).toBe(false);
      expect(v.reason).toMatch(/no chain_keyed record for key/);
      await close();
    });

    it("refuses another key; without the key it verifies nothing as intact and appends nothing", async () => {
      const { trail, close } = await open();
      const log = await trail({ key: ephemeralAuditKey(), keyCreated: true });
      await appendAll(log, 1, 2);
      await expect(trail({ key: ephemeralAuditKey() })).rejects.toThrow(/holds key/);
      const keyless = await trail({ key: null });
      const v = await keyless.verify();
      expect(v.ok).toBe(false);
      expect(v.reason).toMatch(/key file is missing: restore it/);
      await expect(keyless.append(rec(9))).rejects.toThrow(/read-only/);
      await close();
    });
  });
}
