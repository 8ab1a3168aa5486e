// Console audit page views beside steady MCP traffic, over a large audit trail. The trail gets
// `records` records straight through the store (chained under the server's key, one
// transaction), then an HTTP server starts on it and its background verifier catches up (timed
// and reported). Then, side by side in alternating rounds: `callers` MCP clients calling
// run_inference (mnist-cnn batch 1) over HTTP, without and with an operator viewing the audit page
// back to back (a filter on every other view). The figure is the calls' p99 with views ÷ without.
// A page view must never verify the chain in the request (audit_verify.ts); before that change,
// each view parsed and HMAC'd the whole trail on the event loop.
import Database from "better-sqlite3";
import { readFileSync, writeFileSync } from "node:fs";
import { SqliteAuditTrail } from "../server/stores/audit/sqlite.js";
import { loadOrCreateAuditKey } from "../policies/audit_key.js";
import { hashToken } from "../policies/config.js";
import { parseConfig } from "../server/config/config.js";
import { dataDir } from "../server/config/data_dir.js";
import { connectHttp, startHttpServer } from "../test/helpers/server.js";
import { ROOT } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, percentile, summarize, withCallers } from "./lib/stats.js";

export interface AuditBenchOptions {
  config: string;
  records: number;
  callers: number;
  /** Calls per round, each arm. */
  perRound: number;
  rounds: number;
  /** Pause between one page view's answer and the next view. */
  viewGapMs: number;
  say: (msg: string) => void;
}

const AGENT = "bench-audit-agent-token";
const OPERATOR = "bench-audit-operator-token";

/** An agent that runs inference and an operator who views the console (approvals:grant). */
function addTokens(configFile: string): void {
  const c = JSON.parse(readFileSync(configFile, "utf8"));
  c.policy = {
    ...c.policy,
    tokens: [
      {
        id: "agent",
        token_sha256: hashToken(AGENT),
        scopes: ["models:read", "models:load", "inference:run"],
      },
      { id: "operator", token_sha256: hashToken(OPERATOR), scopes: ["approvals:grant"] },
    ],
  };
  writeFileSync(configFile, JSON.stringify(c));
}

/** Appends `n` records in one transaction, chained under the key the server will use. */
function fillTrail(configFile: string, n: number): void {
  const config = parseConfig(JSON.parse(readFileSync(configFile, "utf8")), { root: ROOT });
  const { key, created } = loadOrCreateAuditKey(config.paths.audit_key);
  const db = new Database(dataDir(config).policyDb);
  db.pragma("journal_mode = WAL");
  const log = new SqliteAuditTrail(db, { key, keyCreated: created });
  const t = Date.parse("2026-11-01T00:00:00Z");
  db.transaction(() => {
    for (let i = 0; i < n; i++) {
      log.append({
        time: new Date(t + i * 10).toISOString(),
        principal: i % 7 ? "agent" : "reader",
        tool: "run_inference",
        args_digest: "ab".repeat(32),
        args: { model: "mnist-cnn", tensors: { redacted: true, count: 1 } },
        outcome: i % 2 ? "executed" : "allowed",
        ...(i % 2 ? { duration_ms: i % 13 } : {}),
      });
    }
  })();
  db.close();
}

export async function runAudit(o: AuditBenchOptions): Promise<SectionResult> {
  const s = section("audit");
  addTokens(o.config);
  const t0 = performance.now();
  fillTrail(o.config, o.records);
  const fillS = (performance.now() - t0) / 1000;
  o.say(`audit: ${o.records} records written in ${fillS.toFixed(1)} s; starting the server…`);

  const srv = await startHttpServer(o.config);
  const base = srv.url.replace(/\/mcp$/, "");
  const conns = await Promise.all(
    Array.from({ length: o.callers }, () => connectHttp(srv.url, AGENT)),
  );
  try {
    const signIn = await fetch(`${base}/console/api/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: OPERATOR }),
    });
    if (signIn.status !== 200) throw new Error(`console sign-in refused: ${signIn.status}`);
    const cookie = (signIn.headers.get("set-cookie") ?? "").split(";")[0];
    const view = async (filtered: boolean) => {
      const q = filtered ? "?principal=reader&outcome=executed" : "";
      const r = await fetch(`${base}/console/api/audit${q}`, { headers: { cookie } });
      if (r.status !== 200) throw new Error(`audit page: ${r.status}`);
      return (await r.json()).verify;
    };

    // The background verifier's first pass over the whole trail (no checkpoint yet).
    const tv = performance.now();
    let v = await view(false);
    const firstAnswerMs = performance.now() - tv;
    while (v.ok && v.verified_seq < v.head_seq) {
      await new Promise((r) => setTimeout(r, 250));
      v = await view(false);
    }
    if (!v.ok) throw new Error(`audit verification failed: ${v.reason}`);
    const catchUpS = (performance.now() - tv) / 1000;
    o.say(
      `audit: verified ${v.verified_seq} records in the background in ${catchUpS.toFixed(1)} s`,
    );

    await conns[0].client.callTool({ name: "load_model", arguments: { model: "mnist-cnn" } });
    const values = Array.from({ length: 784 }, (_, i) => ((i * 37) % 255) / 255);
    const args = {
      model: "mnist-cnn",
      tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: values }],
    };
    const traffic = async (into: number[]) => {
      await withCallers(o.callers, o.perRound, async (i) => {
        const c = conns[i % o.callers].client;
        const t = performance.now();
        const r = await c.callTool({ name: "run_inference", arguments: args });
        if (r.isError) throw new Error(`run_inference failed: ${JSON.stringify(r.content)}`);
        into.push(performance.now() - t);
      });
    };
    // Warm-up, outside the figures.
    await traffic([]);

    const quiet: number[] = [];
    const viewed: number[] = [];
    const viewMs: number[] = [];
    for (let round = 0; round < o.rounds; round++) {
      // Alternate which arm goes first, so drift over the run falls on both.
      const arms = round % 2 ? (["viewed", "quiet"] as const) : (["quiet", "viewed"] as const);
      for (const arm of arms) {
        if (arm === "quiet") {
          await traffic(quiet);
          continue;
        }
        let going = true;
        let n = 0;
        const viewer = (async () => {
          while (going) {
            const t = performance.now();
            await view(n++ % 2 === 1);
            viewMs.push(performance.now() - t);
            await new Promise((r) => setTimeout(r, o.viewGapMs));
          }
        })();
        await traffic(viewed);
        going = false;
        await viewer;
      }
    }
    const end = await view(false);

    const q99 = percentile(quiet, 99);
    const v99 = percentile(viewed, 99);
    const ratio = v99 / q99;
    const pass = ratio <= 1.2;
    s.row(
      "trail",
      `${end.head_seq} records`,
      `${o.records} written in ${fillS.toFixed(1)} s; first verified in the background in ${catchUpS.toFixed(1)} s (the first page view answered in ${fmt.ms(firstAnswerMs)})`,
    );
    s.row(
      "calls without page views",
      fmt.ms(q99),
      `p99 of ${quiet.length} calls, ${o.callers} callers (p50 ${fmt.ms(summarize(quiet).p50)})`,
    );
    s.row(
      "calls with page views",
      fmt.ms(v99),
      `p99 of ${viewed.length} calls (p50 ${fmt.ms(summarize(viewed).p50)})`,
    );
    s.row(
      "page views",
      `${viewMs.length}`,
      `p50 ${fmt.ms(summarize(viewMs).p50)}, p99 ${fmt.ms(percentile(viewMs, 99))}; one every ${o.viewGapMs} ms after the last answer`,
    );
    s.row("p99 with views ÷ without", `${ratio.toFixed(3)}×`, `${pass ? "PASS" : "MISS"} (≤ 1.2×)`);
    s.fig("p99_ratio", ratio);
    s.fig("quiet_p99_ms", q99);
    s.fig("viewed_p99_ms", v99);
    s.fig("view_p50_ms", summarize(viewMs).p50);
    s.fig("records", end.head_seq);
    s.fig("first_verify_s", catchUpS);
    if (!end.ok) s.note(`audit verification reported a fault: ${end.reason}`);
  } finally {
    await Promise.allSettled(conns.map((c) => c.close()));
    await srv.stop();
  }
  return s.result();
}
