// The chain: how each record is linked to the one before it (HMAC-SHA256 under the key kept
// outside the database; plain SHA-256 for trails written before the key), and the walk that
// checks it — record by record, then the head row's MAC, the key's anchor (chain_keyed) and an
// exported head — plus the MAC'd verification checkpoint a server resumes from. The checks
// (ChainRules) do no I/O, so every backend walks its rows through the same ones: AuditChain here
// reads SQLite, server/stores/audit/postgres.ts Postgres. Reads only: the appends are the stores'.

import { createHmac } from "node:crypto";
import type { AuditKey } from "./audit_key.js";
import type { AuditRecord } from "./audit_record.js";
import { canonicalJson, sha256Hex } from "./digest.js";
import type { SqliteDb } from "./sqlite.js";

export interface AuditVerifyResult {
  ok: boolean;
  checked: number;
  first_bad_seq?: number;
  reason: string;
}

/**
 * How far verification has got: records 1..seq chain correctly, the last with `hash`. Stored
 * MAC'd with the audit key (a checkpoint someone without the key writes is caught), so that a
 * server verifies only the records after it.
 */
export interface AuditCheckpoint {
  seq: number;
  hash: string;
  /** The chain_keyed record's seq when it is at or before `seq` (null: not yet keyed). */
  keyed_from: number | null;
  verified_at: string;
}

/** A verification in progress (see SqliteAuditTrail.walk). */
export interface VerifyCursor {
  expectedSeq: number;
  prev: string;
  keyed: boolean;
  keyedFrom: number | null;
  foreignKey: string | null;
  /** Records verified so far, those before a checkpoint included. */
  checked: number;
}

/** The last record's position and hash: an operator stores it elsewhere (`tpu-mcp audit head`). */
export interface AuditHead {
  seq: number;
  hash: string;
  /** The time of the record at `seq` (null for an empty trail). */
  time: string | null;
  key_id: string | null;
}

export const GENESIS_HASH = "0".repeat(64);

/** The unkeyed chain of trails written before the key existed (kept to verify them). */
export function chainHash(prevHash: string, seq: number, record: AuditRecord): string {
  return sha256Hex(prevHash + canonicalJson({ ...record, seq }));
}

export function keyedChainHash(
  key: Buffer,
  prevHash: string,
  seq: number,
  record: AuditRecord,
): string {
  return chainMac(key, prevHash, canonicalJson({ ...record, seq }));
}

/** The keyed link: HMAC-SHA256 of the previous hash and the record's canonical text with seq. */
export function chainMac(key: Buffer, prevHash: string, canonicalWithSeqText: string): string {
  return createHmac("sha256", key)
    .update(prevHash + canonicalWithSeqText, "utf8")
    .digest("hex");
}

export function headMac(key: Buffer, seq: number, hash: string): string {
  return createHmac("sha256", key).update(`audit-head\u0000${seq}\u0000${hash}`).digest("hex");
}

function checkpointMac(key: Buffer, cp: AuditCheckpoint): string {
  return createHmac("sha256", key)
    .update(
      `audit-checkpoint\u0000${cp.seq}\u0000${cp.hash}\u0000${cp.keyed_from ?? ""}\u0000${cp.verified_at}`,
    )
    .digest("hex");
}

/** A stored record as every backend reads it (the text exactly as written). */
export interface ChainRow {
  seq: number;
  record: string;
  prev_hash: string;
  hash: string;
}

/** The head row: the last seq and hash, MAC'd (mac null on a trail from before the key). */
export interface HeadRow {
  seq: number;
  hash: string;
  mac: string | null;
}

/** The checkpoint row as stored: the checkpoint and its MAC. */
export interface CheckpointRow extends AuditCheckpoint {
  mac: string;
}

/**
 * The verification's rules, over rows any backend reads: SQLite (AuditChain below) and Postgres
 * (server/stores/audit/postgres.ts) walk their rows through these same checks, so a trail verifies
 * the same, with the same reasons, wherever it is stored. `anchored`: the trail must hold a
 * chain_keyed record for the key (false for a process's throwaway key, whose whole trail is
 * keyed from record 1). No I/O here.
 */
export class ChainRules {
  constructor(
    readonly key: AuditKey | null,
    readonly anchored: boolean,
  ) {}

  /**
   * Where a verification starts: the first record, or just after a checkpoint (whose MAC the
   * caller has checked), trusting what the checkpoint says about the records before it.
   */
  cursorAt(cp: AuditCheckpoint | null): VerifyCursor {
    if (!cp) {
      const keyed = !this.anchored;
      return {
        expectedSeq: 1,
        prev: GENESIS_HASH,
        keyed,
        keyedFrom: keyed ? 1 : null,
        foreignKey: null,
        checked: 0,
      };
    }
    return {
      expectedSeq: cp.seq + 1,
      prev: cp.hash,
      keyed: !this.anchored || cp.keyed_from !== null,
      keyedFrom: !this.anchored ? 1 : cp.keyed_from,
      foreignKey: null,
      checked: cp.seq,
    };
  }

  /** Checks the next row after the cursor and moves the cursor past it; a failure, or null. */
  step(cur: VerifyCursor, r: ChainRow): AuditVerifyResult | null {
    const key = this.key;
    const bad = (seq: number, reason: string) => this.failure(cur, seq, reason);
    if (r.seq !== cur.expectedSeq)
      return bad(
        cur.expectedSeq,
        `record ${cur.expectedSeq} is missing (next present is ${r.seq})`,
      );
    if (r.prev_hash !== cur.prev)
      return bad(r.seq, `record ${r.seq} does not follow record ${r.seq - 1} (prev_hash differs)`);
    let rec: AuditRecord;
    try {
      rec = JSON.parse(r.record) as AuditRecord;
    } catch {
      return bad(r.seq, `record ${r.seq} is not valid JSON`);
    }
    if (r.record !== canonicalJson(rec))
      return bad(r.seq, `record ${r.seq} was modified (not in canonical form)`);
    if (!cur.keyed && rec.outcome === "chain_keyed") {
      if (!key) cur.foreignKey = rec.key_id ?? "?";
      else if (rec.key_id !== key.id)
        return bad(
          r.seq,
          `record ${r.seq} starts a chain under key ${rec.key_id}, but the key file holds key ${key.id}`,
        );
      else {
        cur.keyed = true;
        cur.keyedFrom = r.seq;
      }
    }
    if (cur.foreignKey) {
      return bad(
        r.seq,
        `the trail is chained with key ${cur.foreignKey} from record ${r.seq} on, and the key file is missing: restore it to verify`,
      );
    }
    if (cur.keyed) {
      if (keyedChainHash(key!.key, cur.prev, r.seq, rec) !== r.hash)
        return bad(
          r.seq,
          `record ${r.seq} was modified or rewritten (its HMAC does not match: the chain was recomputed without the key)`,
        );
    } else if (chainHash(cur.prev, r.seq, rec) !== r.hash) {
      if (key && keyedChainHash(key.key, cur.prev, r.seq, rec) === r.hash)
        return bad(
          r.seq,
          `record ${r.seq} is keyed but no chain_keyed record precedes it: the start of the trail was removed`,
        );
      return bad(r.seq, `record ${r.seq} was modified (hash does not match its content)`);
    }
    cur.prev = r.hash;
    cur.expectedSeq++;
    cur.checked++;
    return null;
  }

  /** After the last record: the head row (position, hash, MAC) and the key's anchor. */
  end(cur: VerifyCursor, head: HeadRow | undefined): AuditVerifyResult | null {
    const key = this.key;
    const bad = (seq: number, reason: string) => this.failure(cur, seq, reason);
    const lastSeq = cur.expectedSeq - 1;
    if (head && head.seq > lastSeq) {
      return bad(lastSeq + 1, `records ${lastSeq + 1}..${head.seq} are missing from the end`);
    }
    if (head && (head.seq !== lastSeq || head.hash !== cur.prev)) {
      return bad(lastSeq, `the head (seq ${head.seq}) does not match the last record ${lastSeq}`);
    }
    if (!head && cur.checked > 0) return bad(1, "audit head is missing");
    if (this.anchored && key && !cur.keyed) {
      return bad(
        lastSeq + 1,
        cur.checked === 0
          ? `the trail is empty, but the key ${key.id} (created ${key.created_at}) exists: the trail was wiped or the database replaced`
          : `no chain_keyed record for key ${key.id} (created ${key.created_at}): the trail was reset or rewritten without the key`,
      );
    }
    if (head && cur.keyed && key && lastSeq >= (cur.keyedFrom ?? 1)) {
      if (head.mac !== headMac(key.key, head.seq, head.hash))
        return bad(
          lastSeq,
          `the head row was rewritten (its MAC does not match): records after ${lastSeq} were probably removed`,
        );
    }
    return null;
  }

  /**
   * After `end`: a head exported earlier (`tpu-mcp audit head`) must still be in the trail.
   * `hashAt`: the stored hash of record `exported.seq` (undefined when there is none).
   */
  againstExported(
    cur: VerifyCursor,
    exported: AuditHead,
    hashAt: string | undefined,
  ): AuditVerifyResult | null {
    const key = this.key;
    const bad = (seq: number, reason: string) => this.failure(cur, seq, reason);
    const lastSeq = cur.expectedSeq - 1;
    const h = exported;
    if (h.key_id && key && this.anchored && h.key_id !== key.id)
      return bad(h.seq, `the exported head names key ${h.key_id}, the key file holds ${key.id}`);
    if (h.seq > lastSeq)
      return bad(
        lastSeq + 1,
        `the exported head is record ${h.seq}, but the trail ends at ${lastSeq}: records ${lastSeq + 1}..${h.seq} were removed`,
      );
    if (h.seq > 0 && hashAt !== h.hash)
      return bad(
        h.seq,
        `record ${h.seq} differs from the exported head: the trail was rewritten since the export`,
      );
    return null;
  }

  /**
   * After a full walk: the stored checkpoint must name a record as it is now. `hashAt`: the
   * stored hash of record `cp.seq`.
   */
  againstCheckpoint(
    cur: VerifyCursor,
    cp: AuditCheckpoint,
    hashAt: string | undefined,
  ): AuditVerifyResult | null {
    if (cp.seq > 0 && hashAt !== cp.hash)
      return this.failure(
        cur,
        cp.seq,
        `record ${cp.seq} differs from the verification checkpoint: the trail was rewritten after it was verified`,
      );
    return null;
  }

  failure(cur: VerifyCursor, seq: number, reason: string): AuditVerifyResult {
    return { ok: false, checked: cur.checked, first_bad_seq: seq, reason };
  }

  success(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult {
    const note = !this.key
      ? " (not keyed: no key file, hashes only)"
      : cur.keyedFrom && cur.keyedFrom > 1
        ? ` (records 1..${cur.keyedFrom - 1} predate the key and are pinned by record ${cur.keyedFrom})`
        : "";
    const against = exported ? `, and include the exported head #${exported.seq}` : "";
    return {
      ok: true,
      checked: cur.checked,
      reason:
        cur.checked === 0
          ? `empty log${note}`
          : `${cur.checked} records chain correctly${against}${note}`,
    };
  }

  /**
   * A stored checkpoint row read back: `checkpoint` when its MAC holds, `forged` when it does
   * not (someone without the key wrote it), neither when there is none (or no key to check it).
   */
  checkpointOf(row: CheckpointRow | undefined): {
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  } {
    const key = this.key;
    if (!key || !row) return {};
    const cp: AuditCheckpoint = {
      seq: row.seq,
      hash: row.hash,
      keyed_from: row.keyed_from,
      verified_at: row.verified_at,
    };
    if (row.mac !== checkpointMac(key.key, cp))
      return {
        forged: {
          seq: Math.max(1, row.seq),
          reason: `the verification checkpoint (record ${row.seq}) was rewritten: its MAC does not match the key; run \`tpu-mcp audit verify\``,
        },
      };
    return { checkpoint: cp };
  }

  /** The cursor as a checkpoint row to store, MAC'd with the key (null without a key). */
  checkpointRow(cur: VerifyCursor, verifiedAt: string): CheckpointRow | null {
    const key = this.key;
    if (!key) return null;
    const cp: AuditCheckpoint = {
      seq: cur.expectedSeq - 1,
      hash: cur.prev,
      keyed_from: this.anchored ? cur.keyedFrom : null,
      verified_at: verifiedAt,
    };
    return { ...cp, mac: checkpointMac(key.key, cp) };
  }
}

/** Verification over one SQLite store: its rows read through ChainRules. */
export class AuditChain {
  private readonly rules: ChainRules;

  constructor(
    private readonly db: SqliteDb,
    key: AuditKey | null,
    anchored: boolean,
    private readonly onRowsHashed?: (rows: number) => void,
  ) {
    this.rules = new ChainRules(key, anchored);
  }

  verify(opts: { head?: AuditHead } = {}): AuditVerifyResult {
    // One read transaction: rows and head from one snapshot, even while another process appends.
    return this.db.transaction(() => {
      const cur = this.cursorAt(null);
      const bad = this.walk(cur, Number.POSITIVE_INFINITY) ?? this.checkEnd(cur, opts.head);
      if (bad) return bad;
      const cp = this.readCheckpoint();
      if (cp.forged) return this.rules.failure(cur, cp.forged.seq, cp.forged.reason);
      if (cp.checkpoint) {
        const bad = this.rules.againstCheckpoint(
          cur,
          cp.checkpoint,
          this.hashAt(cp.checkpoint.seq),
        );
        if (bad) return bad;
      }
      return this.success(cur, opts.head);
    })();
  }

  private hashAt(seq: number): string | undefined {
    const r = this.db.prepare("SELECT hash FROM audit_log WHERE seq = ?").get(seq) as
      { hash: string } | undefined;
    return r?.hash;
  }

  cursorAt(cp: AuditCheckpoint | null): VerifyCursor {
    return this.rules.cursorAt(cp);
  }

  /**
   * Verifies up to `maxRows` records after the cursor, moving it; a failure, or null. Between
   * calls other records may be appended: the cursor carries on from where it stopped.
   */
  walk(cur: VerifyCursor, maxRows: number): AuditVerifyResult | null {
    const rows = (
      Number.isFinite(maxRows)
        ? this.db
            .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq LIMIT ?")
            .iterate(cur.expectedSeq, Math.max(0, Math.floor(maxRows)))
        : this.db
            .prepare("SELECT * FROM audit_log WHERE seq >= ? ORDER BY seq")
            .iterate(cur.expectedSeq)
    ) as Iterable<ChainRow>;
    let hashed = 0;
    try {
      for (const r of rows) {
        hashed++;
        const bad = this.rules.step(cur, r);
        if (bad) return bad;
      }
      return null;
    } finally {
      this.onRowsHashed?.(hashed);
    }
  }

  /** After the last record: the head (position, hash, MAC), the key's anchor, an exported head. */
  checkEnd(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult | null {
    const head = this.db.prepare("SELECT seq, hash, mac FROM audit_head WHERE id = 1").get() as
      HeadRow | undefined;
    const bad = this.rules.end(cur, head);
    if (bad || !exported) return bad;
    return this.rules.againstExported(
      cur,
      exported,
      exported.seq > 0 ? this.hashAt(exported.seq) : undefined,
    );
  }

  success(cur: VerifyCursor, exported?: AuditHead): AuditVerifyResult {
    return this.rules.success(cur, exported);
  }

  /** The stored verification checkpoint, its MAC checked (ChainRules.checkpointOf). */
  readCheckpoint(): {
    checkpoint?: AuditCheckpoint;
    forged?: { seq: number; reason: string };
  } {
    if (!this.rules.key) return {};
    const exists = this.db
      .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit_checkpoint'")
      .get();
    if (!exists) return {};
    const row = this.db.prepare("SELECT * FROM audit_checkpoint WHERE id = 1").get() as
      CheckpointRow | undefined;
    return this.rules.checkpointOf(row);
  }

  /** Stores the cursor as the verified checkpoint, MAC'd with the key (nothing without a key). */
  writeCheckpoint(cur: VerifyCursor, verifiedAt: string): AuditCheckpoint | null {
    const row = this.rules.checkpointRow(cur, verifiedAt);
    if (!row) return null;
    this.db.exec(`CREATE TABLE IF NOT EXISTS audit_checkpoint (
      id INTEGER PRIMARY KEY CHECK (id = 1),
      seq INTEGER NOT NULL,
      hash TEXT NOT NULL,
      keyed_from INTEGER,
      verified_at TEXT NOT NULL,
      mac TEXT NOT NULL
    )`);
    this.db
      .prepare(
        "INSERT INTO audit_checkpoint (id, seq, hash, keyed_from, verified_at, mac) VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, keyed_from = excluded.keyed_from, verified_at = excluded.verified_at, mac = excluded.mac",
      )
      .run(row.seq, row.hash, row.keyed_from, row.verified_at, row.mac);
    return {
      seq: row.seq,
      hash: row.hash,
      keyed_from: row.keyed_from,
      verified_at: row.verified_at,
    };
  }
}
