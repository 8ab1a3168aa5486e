// The console's audit page against a large trail (100k records, written straight into the
// store): a page view runs no full verification. It answers at once with how far the background
// verifier has got, other requests are answered while the verifier catches up, and the verifier
// never hashes more than one bounded chunk per event-loop turn. Structural checks only (no
// timings: the machine is shared). The full pass stays the CLI's: `tpu-mcp audit verify`.
import Database from "better-sqlite3";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { SqliteAuditLog, type VerifyCursor } from "../../policies/audit.js";
import { readAuditKey } from "../../policies/audit_key.js";
import { createApp, type App } from "../../server/app/app.js";
import { parseConfig } from "../../server/config/config.js";
import { startHttp, type RunningHttp } from "../../server/transports/http.js";
import { dataDir } from "../../server/config/data_dir.js";
import { baseConfig } from "../hardening/helpers.js";
import { cli, DEMO_POLICY, DEMO_TOKENS, ROOT } from "../helpers/server.js";

const ROWS = 100_000;
/** The verifier's records per event-loop turn (AuditVerifier's default chunk). */
const CHUNK = 500;

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
    app = createApp(config, pino({ level: "silent" }));
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
      const v = (
        await (
          await fetch(`${base}/console/api/audit`, { headers: { cookie, connection: "close" } })
        ).json()
      ).verify;
      if (!v.in_progress && v.verified_seq === v.head_seq) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // Straight into the store, chained under the server's key: one transaction, no tool calls.
    const db = new Database(dataDir(config).policyDb);
    const writer = new SqliteAuditLog(db, { key: readAuditKey(config.paths.audit_key) });
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
  }, 300_000);
  afterAll(async () => {
    await http?.close();
    await app?.close();
  });

  it("answers without a full pass, and verifies in bounded steps while other requests are answered", async () => {
    // Every request on a fresh connection: the set-up blocked this process (server included) for
    // seconds, and a kept-alive socket the server times out meanwhile answers ECONNRESET.
    const fullPass = vi.spyOn(app.audit, "verify");
    const page = await fetch(`${base}/console/api/audit?limit=5`, {
      headers: { cookie, connection: "close" },
    });
    expect(page.status).toBe(200);
    const body = await page.json();
    expect(fullPass).not.toHaveBeenCalled();
    expect(body.records).toHaveLength(5);
    expect(body.scanned).toBe(5000);
    const head = body.verify.head_seq as number;
    expect(head).toBeGreaterThan(ROWS);
    // The request asked for a catch-up and answered before doing any of it.
    expect(body.verify).toMatchObject({ ok: true, in_progress: true });
    expect(body.verify.verified_seq).toBeLessThan(head);
    expect(body.verify.checked).toBe(body.verify.verified_seq);

    // From here on: records verified between two turns of the event loop (turns other calls use).
    let sinceTurn = 0;
    let worstTurn = 0;
    let walks = 0;
    let walksAfterReady = 0;
    let readyAnswered = false;
    const walk = app.audit.walk.bind(app.audit);
    vi.spyOn(app.audit, "walk").mockImplementation((cur: VerifyCursor, max: number) => {
      const before = cur.checked;
      const out = walk(cur, max);
      sinceTurn += cur.checked - before;
      walks++;
      if (readyAnswered) walksAfterReady++;
      return out;
    });
    let ticking = true;
    const tick = () => {
      worstTurn = Math.max(worstTurn, sinceTurn);
      sinceTurn = 0;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);

    // Another request, while the verifier still has most of the trail ahead of it.
    expect((await fetch(`${base}/readyz`, { headers: { connection: "close" } })).status).toBe(503); // lazy worker: answered, not ready
    readyAnswered = true;

    let v = body.verify;
    while (v.verified_seq < head) {
      await new Promise((r) => setTimeout(r, 100));
      v = (
        await (
          await fetch(`${base}/console/api/audit`, { headers: { cookie, connection: "close" } })
        ).json()
      ).verify;
      expect(v.ok).toBe(true);
    }
    ticking = false;
    expect(fullPass).not.toHaveBeenCalled();
    expect(walks).toBeGreaterThan(ROWS / CHUNK / 2);
    expect(walksAfterReady).toBeGreaterThan(0); // the verifier was still at work after /readyz
    expect(worstTurn).toBeGreaterThan(0);
    expect(worstTurn).toBeLessThanOrEqual(CHUNK);
    expect(v.verified_at).toMatch(/^\d{4}-/);
    vi.restoreAllMocks();
  }, 300_000);

  it("leaves a change before the checkpoint to `tpu-mcp audit verify`, which catches it", async () => {
    // The checkpoint now covers the whole trail; a record far behind it is rewritten.
    const db = new Database(dataDir(app.config).policyDb);
    const row = db.prepare("SELECT record FROM audit_log WHERE seq = 1000").get() as {
      record: string;
    };
    db.prepare("UPDATE audit_log SET record = ? WHERE seq = 1000").run(
      row.record.replace('"agent"', '"mallory"'),
    );
    db.close();
    const v = (
      await (
        await fetch(`${base}/console/api/audit`, { headers: { cookie, connection: "close" } })
      ).json()
    ).verify;
    expect(v.ok).toBe(true); // the incremental verifier starts after the checkpoint
    const full = await cli(configFile, "audit", "verify");
    expect(full.code).not.toBe(0);
    expect(full.stdout + full.stderr).toMatch(/1000/);
  }, 120_000);
});
