// The audit trail on a real PostgreSQL, shared by three replicas (three pools, as three
// processes would hold): one chain whatever the races, records SQLite's code verifies as its
// own, exports a receiver checks without the key, refusals counted across replicas, and a
// verification that resumes from the shared checkpoint.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type AuditRecord, type StoredAuditRecord } from "../../policies/audit.js";
import { verifyExport } from "../../policies/audit_export_proof.js";
import { ephemeralAuditKey } from "../../policies/audit_key.js";
import { emptyStoreDb } from "../../policies/sqlite.js";
import { queryable } from "../../server/stores/pg/ambient.js";
import { PgAuditTrail, type PgAuditOptions } from "../../server/stores/audit/postgres.js";
import { openPool, type PgPool } from "../../server/stores/pg/pool.js";
import { migrate } from "../../server/app/postgres/schema.js";
import { startPostgres, type TestPostgres } from "../helpers/postgres.js";

let db: TestPostgres;
let pools: PgPool[];
const NAMES = ["a", "b", "c"];
const key = ephemeralAuditKey();
const opened: PgAuditTrail[] = [];

beforeAll(async () => {
  db = await startPostgres();
  pools = NAMES.map((n) => openPool(db.url, { max: 6, application: `tpu-mcp-${n}` }));
  await migrate(pools[0]!);
});

afterAll(async () => {
  for (const t of opened) await t.close();
  await Promise.all((pools ?? []).map((p) => p.end()));
  await db?.stop();
});

/** Replica `i`'s trail under the deployment's key. */
async function trail(i: number, extra: Partial<PgAuditOptions> = {}): Promise<PgAuditTrail> {
  const t = await PgAuditTrail.open(pools[i]!, {
    replica: NAMES[i]!,
    key,
    keyCreated: true,
    ...extra,
  });
  opened.push(t);
  return t;
}

const rec = (principal: string, n: number, extra: Partial<AuditRecord> = {}): AuditRecord => ({
  time: new Date().toISOString(),
  principal,
  tool: "run_inference",
  args_digest: `d-${principal}-${n}`,
  outcome: "executed",
  duration_ms: n,
  ...extra,
});

const q = (sql: string, params: unknown[] = []) => pools[0]!.query(sql, params);

/** Every stored row, oldest first. */
async function rows() {
  return (await q("SELECT seq, record, prev_hash, hash FROM audit_records ORDER BY seq")).rows.map(
    (r) => ({ ...r, seq: Number(r.seq) }),
  ) as { seq: number; record: string; prev_hash: string; hash: string }[];
}

/** The trail copied into a SQLite store: what SqliteAuditTrail's own code says of the same rows. */
async function asSqlite(): Promise<SqliteAuditTrail> {
  const sdb = emptyStoreDb();
  new SqliteAuditTrail(sdb, { key: null }); // its tables
  const insert = sdb.prepare(
    "INSERT INTO audit_log (seq, record, prev_hash, hash) VALUES (?, ?, ?, ?)",
  );
  for (const r of await rows()) insert.run(r.seq, r.record, r.prev_hash, r.hash);
  const h = (await q("SELECT seq, hash, mac FROM audit_head")).rows[0];
  sdb
    .prepare("INSERT INTO audit_head (id, seq, hash, mac) VALUES (1, ?, ?, ?)")
    .run(Number(h.seq), h.hash, h.mac);
  return new SqliteAuditTrail(sdb, { key });
}

describe("one chain across replicas", () => {
  it("3 replicas start at once (one chain_keyed), then 3 × 20 concurrent appends form one chain in each replica's call order", async () => {
    const trails = await Promise.all([0, 1, 2].map((i) => trail(i)));
    const keyed = (await rows()).filter((r) => JSON.parse(r.record).outcome === "chain_keyed");
    expect(keyed).toHaveLength(1);

    const told: StoredAuditRecord[][] = [[], [], []];
    trails.forEach((t, i) => t.onAppended((rs) => told[i]!.push(...rs)));
    // Each replica appends one record per event-loop turn without waiting for the last: its
    // records span many commits in flight at once.
    const results = (
      await Promise.all(
        trails.map(async (t, i) => {
          const mine: Promise<StoredAuditRecord>[] = [];
          for (let n = 0; n < 20; n++) {
            mine.push(n % 2 ? t.append(rec(NAMES[i]!, n)) : t.appendDurable(rec(NAMES[i]!, n)));
            await new Promise((r) => setImmediate(r));
          }
          return Promise.all(mine);
        }),
      )
    ).flat();
    const all = await rows();
    expect(all.map((r) => r.seq)).toEqual(Array.from({ length: 61 }, (_, i) => i + 1));
    for (const [i, name] of NAMES.entries()) {
      // Each replica's records in the order it appended them; told of its own, and only those.
      const mine = all.map((r) => JSON.parse(r.record)).filter((r) => r.principal === name);
      expect(mine.map((r) => r.duration_ms)).toEqual(Array.from({ length: 20 }, (_, n) => n));
      expect(told[i]!.map((r) => r.principal)).toEqual(Array(20).fill(name));
    }
    expect(results.map((r) => r.seq).sort((a, b) => a - b)).toEqual(all.slice(1).map((r) => r.seq));

    for (const t of trails) expect(await t.verify()).toMatchObject({ ok: true, checked: 61 });
    // The same rows are SQLite's format: its verifier passes them and its export head agrees.
    const sqlite = await asSqlite();
    expect(await sqlite.verify()).toMatchObject({ ok: true, checked: 61 });
    expect((await sqlite.exportHead()).export_hash).toBe(
      (await trails[2]!.exportHead()).export_hash,
    );
    expect(await trails[1]!.head()).toEqual(await sqlite.head());
  });

  it("a write alongside an append is in its transaction: it fails, nothing is appended", async () => {
    const t = await trail(0);
    const before = (await t.head()).seq;
    await t.appendDurable(rec("a", 100), async () => {
      await queryable(pools[0]!).query(
        "INSERT INTO consumed_states (nonce, consumed_ms, replica) VALUES ('with-100', 0, 'a')",
      );
    });
    await expect(
      t.appendDurable(rec("a", 101), async () => {
        await queryable(pools[0]!).query(
          "INSERT INTO consumed_states (nonce, consumed_ms, replica) VALUES ('with-101', 0, 'a')",
        );
        throw new Error("the call's row could not be written");
      }),
    ).rejects.toThrow(/could not be written/);
    expect((await t.head()).seq).toBe(before + 1);
    const nonces = (await q("SELECT nonce FROM consumed_states WHERE nonce LIKE 'with-%'")).rows;
    expect(nonces.map((r) => r.nonce)).toEqual(["with-100"]);
  });

  it("verify fails after a one-row UPDATE, and after the end is cut with the head rewound", async () => {
    const [a, b] = [await trail(0), await trail(1)];
    const original = (await q("SELECT record FROM audit_records WHERE seq = 17")).rows[0].record;
    await q(
      "UPDATE audit_records SET record = replace(record, 'executed', 'denied') WHERE seq = 17",
    );
    const edited = await b.verify();
    expect(edited).toMatchObject({ ok: false, first_bad_seq: 17 });
    expect(edited.reason).toMatch(/record 17 was modified or rewritten/);
    // SQLite's verifier says the same of the same rows.
    expect(await (await asSqlite()).verify()).toEqual(edited);
    await q("UPDATE audit_records SET record = $1 WHERE seq = 17", [original]);
    expect((await a.verify()).ok).toBe(true);

    const last = (await rows()).at(-1)!;
    const head = (await q("SELECT seq, hash, mac FROM audit_head")).rows[0];
    await q("DELETE FROM audit_records WHERE seq = $1", [last.seq]);
    await q("UPDATE audit_head SET seq = $1, hash = $2", [last.seq - 1, last.prev_hash]);
    const cut = await a.verify();
    expect(cut.ok).toBe(false);
    expect(cut.reason).toMatch(/the head row was rewritten/);
    await q(
      "INSERT INTO audit_records (seq, record, prev_hash, hash, replica) VALUES ($1, $2, $3, $4, 'a')",
      [last.seq, last.record, last.prev_hash, last.hash],
    );
    await q("UPDATE audit_head SET seq = $1, hash = $2, mac = $3", [head.seq, head.hash, head.mac]);
    expect((await a.verify()).ok).toBe(true);
  });

  it("a replica with another key is refused at start; a verifier with another key finds the chain forged", async () => {
    await expect(
      PgAuditTrail.open(pools[0]!, { replica: "x", key: ephemeralAuditKey(), keyCreated: true }),
    ).rejects.toThrow(/chained with key .* give every replica the deployment's audit key/);
    const other = await PgAuditTrail.open(pools[0]!, { replica: "x" }); // a key of its own
    opened.push(other);
    expect(await other.verify()).toMatchObject({ ok: false, first_bad_seq: 1 });
  });
});

describe("export", () => {
  it("jsonl and OCSF exports verify without the key against the export head; an edited line fails", async () => {
    const t = await trail(2);
    const head = await t.exportHead();
    for (const format of ["jsonl", "ocsf"] as const) {
      const lines: string[] = [];
      const s = await t.export({ since: 1, format }, (l) => lines.push(l));
      expect(s).toMatchObject({ records: head.seq, first_seq: 1 });
      expect(s.head.export_hash).toBe(head.export_hash);
      expect(verifyExport(lines, head.export_hash)).toMatchObject({ ok: true, records: head.seq });
    }
    const seg: string[] = [];
    await t.export({ since: 10, format: "jsonl" }, (l) => seg.push(l));
    expect(verifyExport(seg, head.export_hash)).toMatchObject({ ok: true, first_seq: 10 });
    const byTime: string[] = [];
    const first = JSON.parse(seg[0]!).record.time as string;
    await t.export({ since: first, format: "jsonl" }, (l) => byTime.push(l));
    expect(JSON.parse(byTime[0]!).seq).toBeLessThanOrEqual(10);

    const edited = seg.map((l, i) =>
      i === 3 ? l.replace(/"principal":"[abc]"/, '"principal":"z"') : l,
    );
    expect(edited).not.toEqual(seg);
    expect(verifyExport(edited, head.export_hash)).toMatchObject({ ok: false, first_bad_seq: 13 });
    // SQLite's export of the same rows is the same bytes (but the time the head line was made).
    const mine: string[] = [];
    await (await asSqlite()).export({ since: 10, format: "jsonl" }, (l) => mine.push(l));
    expect(mine.slice(0, -1)).toEqual(seg.slice(0, -1));
  });
});

describe("refusals counted across replicas", () => {
  it("two replicas racing on one window: the first refusal recorded, every repeat counted, one aggregate", async () => {
    let clock = Date.now();
    const now = () => clock;
    const [a, b] = [await trail(0, { now }), await trail(1, { now })];
    const refusal = (n: number, tool = "run_inference"): AuditRecord => ({
      time: new Date(clock).toISOString(),
      principal: "mallory",
      tool,
      args_digest: `x${n}`,
      outcome: "denied",
      code: "rate_limited",
      reason: "rate limit",
    });
    const got = await Promise.all(
      Array.from({ length: 30 }, (_, n) =>
        (n % 2 ? a : b).appendRefusal(refusal(n, n % 3 ? "run_inference" : "load_model")),
      ),
    );
    const recorded = got.filter((r) => r !== null);
    expect(recorded).toHaveLength(1);
    expect(a.pendingRefusals() + b.pendingRefusals()).toBe(29);
    expect(await a.openRefusals()).toBe(29);

    clock += 61_000;
    await b.flushDueRefusals();
    const denied = (await a.search({ window: 1000, limit: 1000, principal: "mallory" })).records;
    expect(denied).toHaveLength(2);
    const agg = denied[1]!;
    expect(agg).toMatchObject({
      outcome: "denied",
      code: "rate_limited",
      count: 29,
      first_seq: recorded[0]!.seq,
      tool: "*",
    });
    expect(agg.tools).toEqual({
      load_model: 10 - (recorded[0]!.tool === "load_model" ? 1 : 0),
      run_inference: 20 - (recorded[0]!.tool === "run_inference" ? 1 : 0),
    });
    // Sum `count` (1 for a record without it) and you get the refusals.
    expect(denied.reduce((s, r) => s + (r.count ?? 1), 0)).toBe(30);
    expect(await a.openRefusals()).toBe(0);

    // A new window after the end: recorded again; flushRefusals ends it at once.
    expect(await a.appendRefusal(refusal(100))).not.toBeNull();
    expect(await b.appendRefusal(refusal(101))).toBeNull();
    await a.flushRefusals();
    const after = (await b.search({ window: 1000, limit: 1000, principal: "mallory" })).records;
    expect(after.map((r) => r.count ?? 1)).toEqual([1, 29, 1, 1]);
    expect((await b.verify()).ok).toBe(true);
  });
});

describe("checkpointed verification", () => {
  /** A pass from the shared checkpoint in steps of 7 records, as audit_verify.ts runs one. */
  async function pass(t: PgAuditTrail) {
    const cp = await t.readCheckpoint();
    if (cp.forged) return { ok: false, reason: cp.forged.reason };
    const cur = await t.cursorAt(cp.checkpoint ?? null);
    for (;;) {
      const step = await t.verifyStep(cur, 7);
      if (step.bad) return step.bad;
      if (step.end) break;
    }
    const saved = await t.writeCheckpoint(cur, new Date().toISOString());
    return { ok: true, checked: cur.checked, verified_seq: saved?.seq };
  }

  it("resumes on another replica from the checkpoint, hashing only the records after it; a forged checkpoint is caught", async () => {
    let hashedA = 0;
    let hashedB = 0;
    const a = await trail(0, { onRowsHashed: (n) => (hashedA += n) });
    const b = await trail(1, { onRowsHashed: (n) => (hashedB += n) });
    const headSeq = (await a.head()).seq;
    expect(await pass(a)).toMatchObject({ ok: true, verified_seq: headSeq, checked: headSeq });
    expect(hashedA).toBe(headSeq);

    for (let n = 0; n < 5; n++) await a.append(rec("a", 200 + n));
    expect((await b.readCheckpoint()).checkpoint?.seq).toBe(headSeq);
    expect(await pass(b)).toMatchObject({ ok: true, verified_seq: headSeq + 5 });
    expect(hashedB).toBe(5);

    // A slower verifier's older cursor never moves the shared checkpoint back.
    await a.writeCheckpoint(await a.cursorAt(null), new Date().toISOString());
    expect((await b.readCheckpoint()).checkpoint?.seq).toBe(headSeq + 5);

    await q("UPDATE audit_checkpoint SET seq = seq - 1");
    expect((await a.readCheckpoint()).forged?.reason).toMatch(/checkpoint .* was rewritten/);
    expect(await pass(b)).toMatchObject({ ok: false, reason: expect.stringMatching(/rewritten/) });
    expect((await a.verify()).reason).toMatch(/checkpoint .* was rewritten/);
    await q("UPDATE audit_checkpoint SET seq = seq + 1");
    expect((await a.verify()).ok).toBe(true);
  });
});
