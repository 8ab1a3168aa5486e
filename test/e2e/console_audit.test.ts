// The console's audit page against a large trail (100k records, written straight into the
// store): a page view runs no full verification. It answers at once with how far the background
// verifier has got, other requests are answered while the verifier catches up, and the verifier
// never hashes more than one bounded chunk per event-loop turn. Structural checks only (no
// timings: the machine is shared). The full pass stays the CLI's: `tpu-mcp audit verify`.
import Database from "better-sqlite3";
import { mkdtempSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { SqliteAuditTrail } from "../../server/stores/audit/sqlite.js";
import { type VerifyCursor } from "../../policies/audit.js";
import { readAuditKey } from "../../policies/audit_key.js";
import { createApp, type App } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { startHttp, type RunningHttp } from "../../server/transports/http.js";
import { dataDir } from "../../server/config/data_dir.js";
import { baseConfig } from "../hardening/helpers.js";
import { scaled } from "../helpers/calibrate.js";
import { cli, DEMO_POLICY, DEMO_TOKENS, ROOT } from "../helpers/server.js";

const ROWS = 100_000;
/** The verifier's records per event-loop turn (AuditVerifier's default chunk). */
const CHUNK = 500;

/**
 * A GET on a connection of its own, closed after the answer (no agent): the set-up blocks this
 * process (server included) for seconds, and a kept-alive socket the server times out meanwhile
 * answers ECONNRESET; fetch's pool reuses such sockets whatever the request's headers say.
 */
function get(url: string, headers: Record<string, string> = {}) {
  return new Promise<{ status: number; json: () => Promise<any> }>((resolve, reject) => {
    const req = request(url, { agent: false, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        resolve({ status: res.statusCode ?? 0, json: async () => JSON.parse(text) });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

/** The verifier's walks, per event-loop turn (a turn ends at each run of a setImmediate ticker). */
const walks = {
  ticking: true,
  records: 0,
  sinceTurn: 0,
  worstTurn: 0,
  turnsWithWalks: 0,
  onWalk: () => {},
  record(n: number) {
    this.onWalk();
    this.records += n;
    this.sinceTurn += n;
  },
  endTurn() {
    if (this.sinceTurn > 0) this.turnsWithWalks++;
    this.worstTurn = Math.max(this.worstTurn, this.sinceTurn);
    this.sinceTurn = 0;
  },
};

describe("console audit page over a large trail", () => {
  let app: App;
  let http: RunningHttp;
  let base: string;
  let cookie: string;
  let configFile: string;

  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-audit-"));
    const raw = baseConfig(dir, { policy: DEMO_POLICY, runtime: { start: "lazy" } });
    configFile = join(dir, "config.json");
    const { writeFileSync } = await import("node:fs");
    writeFileSync(configFile, JSON.stringify(raw));
    const config = parseConfig(raw, { root: ROOT });
    app = await createApp(config, pino({ level: "silent" }));
    http = await startHttp(app, { host: "127.0.0.1", port: 0 });
    base = http.url.replace(/\/mcp$/, "");
    const r = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: DEMO_TOKENS.operator }),
    });
    expect(r.status).toBe(200);
    cookie = (r.headers.get("set-cookie") ?? "").split(";")[0];
    // The verifier's first pass (started with the server, over a near-empty trail) is over.
    for (;;) {
      const v = (await (await get(`${base}/console/api/audit`, { cookie })).json()).verify;
      if (!v.in_progress && v.verified_seq === v.head_seq) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // Straight into the store, chained under the server's key: one transaction, no tool calls.
    const db = new Database(dataDir(config).policyDb);
    const writer = new SqliteAuditTrail(db, { key: readAuditKey(config.paths.audit_key) });
    db.transaction(() => {
      for (let i = 0; i < ROWS; i++)
        writer.append({
          time: new Date(1_700_000_000_000 + i).toISOString(),
          principal: "agent",
          tool: "run_inference",
          args_digest: "ab".repeat(32),
          outcome: i % 2 ? "executed" : "allowed",
          duration_ms: i % 50,
        });
    })();
    db.close();
    // Counted from now, in the same turn as the rows were written: no verifier walk of them
    // (whoever started its pass) is missed.
    // The SQLite trail's walk, which its verification step runs.
    const trail = app.audit as SqliteAuditTrail;
    const walk = trail.walk.bind(trail);
    vi.spyOn(trail, "walk").mockImplementation((cur: VerifyCursor, max: number) => {
      const before = cur.checked;
      const out = walk(cur, max);
      walks.record(cur.checked - before);
      return out;
    });
    const tick = () => {
      walks.endTurn();
      if (walks.ticking) setImmediate(tick);
    };
    setImmediate(tick);
  }, scaled(300_000));
  afterAll(async () => {
    walks.ticking = false;
    await http?.close();
    await app?.close();
  });

  it(
    "answers without a full pass, and verifies in bounded steps while other requests are answered",
    async () => {
      // What is guaranteed, not how far the verifier has got at some moment (that depends on the
      // machine, and on a pass the server may have started on its own): the page request itself
      // verifies nothing, its status is coherent, and the verification runs one bounded chunk per
      // event-loop turn, with the loop's other work in between (every request on a connection
      // of its own: `get`).
      const fullPass = vi.spyOn(app.audit, "verify");
      // The page's handler runs synchronously from its search to its answer: a walk in between
      // would be verification on the request path.
      let inPage = false;
      let walksInPage = 0;
      const search = app.audit.search.bind(app.audit);
      vi.spyOn(app.audit, "search").mockImplementation((...args) => {
        inPage = true;
        queueMicrotask(() => (inPage = false));
        return search(...args);
      });
      walks.onWalk = () => {
        if (inPage) walksInPage++;
      };

      const page = await get(`${base}/console/api/audit?limit=5`, { cookie });
      expect(page.status).toBe(200);
      const body = await page.json();
      expect(fullPass).not.toHaveBeenCalled();
      expect(walksInPage).toBe(0);
      expect(body.records).toHaveLength(5);
      expect(body.scanned).toBe(5000);
      const head = body.verify.head_seq as number;
      expect(head).toBeGreaterThan(ROWS);
      expect(body.verify.ok).toBe(true);
      expect(body.verify.verified_seq).toBeLessThanOrEqual(head);
      expect(body.verify.checked).toBeGreaterThanOrEqual(body.verify.verified_seq);
      // Behind the head means a catch-up is under way (the page asked for one).
      if (body.verify.verified_seq < head) expect(body.verify.in_progress).toBe(true);

      // Another request is answered whatever the verifier is doing.
      expect((await get(`${base}/readyz`)).status).toBe(503); // lazy worker: answered, not ready

      let v = body.verify;
      while (v.verified_seq < head) {
        await new Promise((r) => setTimeout(r, 100));
        v = (await (await get(`${base}/console/api/audit`, { cookie })).json()).verify;
        expect(v.ok).toBe(true);
      }
      walks.ticking = false;
      expect(fullPass).not.toHaveBeenCalled();
      expect(walksInPage).toBe(0);
      // The rows written in beforeAll were all verified under the spy, in many turns of at most
      // one chunk each: between two of them the event loop ran everything else it had.
      expect(walks.records).toBeGreaterThanOrEqual(ROWS);
      expect(walks.turnsWithWalks).toBeGreaterThanOrEqual(ROWS / CHUNK);
      expect(walks.worstTurn).toBeGreaterThan(0);
      expect(walks.worstTurn).toBeLessThanOrEqual(CHUNK);
      expect(v.verified_at).toMatch(/^\d{4}-/);
      vi.restoreAllMocks();
    },
    scaled(300_000),
  );

  it(
    "leaves a change before the checkpoint to `tpu-mcp audit verify`, which catches it",
    async () => {
      // The checkpoint now covers the whole trail; a record far behind it is rewritten.
      const db = new Database(dataDir(app.config).policyDb);
      const row = db.prepare("SELECT record FROM audit_log WHERE seq = 1000").get() as {
        record: string;
      };
      db.prepare("UPDATE audit_log SET record = ? WHERE seq = 1000").run(
        row.record.replace('"agent"', '"mallory"'),
      );
      db.close();
      const v = (await (await get(`${base}/console/api/audit`, { cookie })).json()).verify;
      expect(v.ok).toBe(true); // the incremental verifier starts after the checkpoint
      const full = await cli(configFile, "audit", "verify");
      expect(full.code).not.toBe(0);
      expect(full.stdout + full.stderr).toMatch(/1000/);
    },
    scaled(120_000),
  );
});
