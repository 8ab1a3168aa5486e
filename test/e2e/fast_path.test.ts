// The promises small calls keep on the fast path (issue 13), end to end: a real `tpu-mcp stdio`
// server, the SDK's real Client, a real worker. Inference starts while its "allowed" record is
// being committed and frames and answers leave corked per event-loop turn; none of that may cost
// an audit record, a budget charge, a refusal, a cancellation or batching.
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { argsDigest } from "../../policies/digest.js";
import { hashToken } from "../../policies/config.js";
import { workOf } from "../../policies/estimate.js";
import { SqliteBudgetLedger } from "../../policies/limits/budget.js";
import { SqliteReports } from "../../tools/stores/reports.js";
import {
  cli,
  connectHttp,
  connectStdio,
  errorOf,
  startHttpServer,
  writeConfig,
} from "../helpers/server.js";
import { scaled, slowdown } from "../helpers/calibrate.js";
import { call } from "./scenario.js";

/** A distinct mnist-cnn input per call, so each call has its own argument digest. */
const input = (i: number) => ({
  model: "mnist-cnn",
  tensors: [
    { dtype: "float32", shape: [1, 1, 28, 28], data: Array(784).fill(((i % 997) + 1) / 1000) },
  ],
});

function dataDirOf(configFile: string): string {
  return JSON.parse(readFileSync(configFile, "utf8")).data_dir;
}

/** Keeps, through the server's own store, a measured cold load of `model` that took `seconds`. */
/** Device time `principal` was charged earlier in the window, as a restarted server reads it. */
function plantSpent(dataDir: string, principal: string, seconds: number): void {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = join(dataDir, "policy.db");
  closeSync(openSync(file, "a", 0o600));
  const ledger = new SqliteBudgetLedger(file, { device_seconds_per_window: 1, window_s: 3600 });
  try {
    ledger.charge(principal, seconds);
    ledger.flush();
  } finally {
    ledger.close();
  }
}

function plantColdLoad(dataDir: string, model: string, seconds: number): void {
  // Private as the server makes its stores (SQLite gives its -wal and -shm files this mode).
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = join(dataDir, "reports.db");
  closeSync(openSync(file, "a", 0o600));
  const reports = new SqliteReports(file);
  try {
    const facts = { id: model, parameters: 0, weight_bytes: 0, dtypes: ["float32"] };
    void reports.recordCall({
      kind: "load",
      model,
      device: "cpu",
      // The work as load_model's estimate sees it (a tensor model's warm-up at one item).
      work: workOf({
        kind: "load",
        args: { model, warmup_shapes: [{ batch: 1, seq_len: 1 }] },
        model: { ...facts, default_dtype: "float32" },
        models_built: 0,
      }),
      seconds,
      at: Date.now() - 60_000,
    });
  } finally {
    reports.close();
  }
}

/** The store as another process reads it (what survives a crash of the server). */
function readPolicyDb<T>(dataDir: string, fn: (db: Database.Database) => T): T {
  const db = new Database(join(dataDir, "policy.db"), { readonly: true });
  try {
    return fn(db);
  } finally {
    db.close();
  }
}

function outcomesFor(dataDir: string, digest: string): string[] {
  return readPolicyDb(dataDir, (db) =>
    (
      db
        .prepare(
          "SELECT json_extract(record, '$.outcome') AS o FROM audit_log WHERE json_extract(record, '$.args_digest') = ? ORDER BY seq",
        )
        .all(digest) as { o: string }[]
    ).map((r) => r.o),
  );
}

describe("small calls on the fast path", () => {
  const config = writeConfig({
    policy: {
      limits: {
        rate_limit: { per_principal_per_minute: 6000 },
        queue_bound: { run_inference: 128 },
      },
    },
  });
  const dataDir = dataDirOf(config);
  let conn: Awaited<ReturnType<typeof connectStdio>>;
  beforeAll(async () => {
    conn = await connectStdio(config);
    const loaded = await call(conn.client, "load_model", { model: "mnist-cnn" });
    expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
  });
  afterAll(async () => {
    await conn?.close();
  });

  it("answers 64 concurrent calls batched, each only once its allowed and executed records are committed", async () => {
    const n = 64;
    const seenAtAnswer: string[][] = [];
    await Promise.all(
      Array.from({ length: n }, async (_, i) => {
        const r = await call(conn.client, "run_inference", input(i));
        expect(r.isError, JSON.stringify(r)).toBeFalsy();
        expect(r.structuredContent.outputs[0].shape).toEqual([1, 10]);
        // At the moment of the answer, another connection already sees both records.
        seenAtAnswer[i] = outcomesFor(dataDir, argsDigest("run_inference", input(i)));
      }),
    );
    for (const outcomes of seenAtAnswer) expect(outcomes).toEqual(["allowed", "executed"]);

    // Concurrent callers shared forwards (the batcher's counters, through get_runtime_status).
    const status = (await call(conn.client, "get_runtime_status", {})).structuredContent;
    const mnist = status.loaded.find((m: any) => m.model === "mnist-cnn");
    expect(mnist.batching.requests).toBeGreaterThanOrEqual(n);
    expect(mnist.batching.requests / mnist.batching.batches).toBeGreaterThan(1);

    // One budget charge per call, written within a turn of the answer.
    await new Promise((r) => setTimeout(r, 50));
    const charges = readPolicyDb(
      dataDir,
      (db) =>
        (
          db
            .prepare("SELECT COUNT(*) AS c FROM budget_charges WHERE tool = 'run_inference'")
            .get() as { c: number }
        ).c,
    );
    expect(charges).toBe(n);

    // And the chain those records extend still verifies.
    const v = await cli(config, "audit", "verify");
    expect(v.code, v.stderr).toBe(0);
    expect(v.stdout).toMatch(/ok/i);
  });

  it("cancels an inference the client aborts: refused to the client, audited, the worker freed", async () => {
    const loaded = await call(conn.client, "load_model", { model: "tiny-gpt2" });
    expect(loaded.isError, JSON.stringify(loaded)).toBeFalsy();
    const args = { model: "tiny-gpt2", texts: ["a long story about"], max_new_tokens: 64 };
    const ctrl = new AbortController();
    const pending = conn.client.callTool({ name: "run_inference", arguments: args }, undefined, {
      signal: ctrl.signal,
      timeout: scaled(60_000),
    });
    // Aborted as soon as the allowed record is committed (the call is running by then).
    const digest = argsDigest("run_inference", args);
    for (let i = 0; i < 200 && outcomesFor(dataDir, digest).length === 0; i++)
      await new Promise((r) => setTimeout(r, 5));
    ctrl.abort();
    await expect(pending).rejects.toThrow();
    let outcomes: string[] = [];
    for (let i = 0; i < 100; i++) {
      outcomes = outcomesFor(dataDir, digest);
      if (outcomes.length >= 2) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // Either it was stopped (failed: cancelled) or it had just finished (executed); both recorded.
    expect(outcomes[0]).toBe("allowed");
    expect(["failed", "executed"]).toContain(outcomes[1]);
    let inFlight = Infinity;
    for (let i = 0; i < 100 && inFlight > 1; i++) {
      inFlight = (await call(conn.client, "get_runtime_status", {})).structuredContent.worker
        .in_flight;
      if (inFlight > 1) await new Promise((r) => setTimeout(r, 50));
    }
    expect(inFlight).toBeLessThanOrEqual(1); // at most the status call itself
    await call(conn.client, "unload_model", { model: "tiny-gpt2" });
  });
});

describe("small calls past the rate limit and the budget", () => {
  it("refuses the calls over the rate limit at once, accounts for each refusal, runs none of them", async () => {
    const config = writeConfig(
      { policy: { limits: { rate_limit: { per_principal_per_minute: 12 } } } },
      mkdtempSync(join(tmpdir(), "tpu-mcp-fast-rate-")),
    );
    const conn = await connectStdio(config);
    let refusedCount = 0;
    try {
      const t0 = Date.now();
      expect((await call(conn.client, "load_model", { model: "mnist-cnn" })).isError).toBeFalsy();
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) => call(conn.client, "run_inference", input(i))),
      );
      // The bucket holds 12 and refills 12 a minute: what a slow load let it refill is allowed too.
      const refilled = Math.floor(((Date.now() - t0) / 60_000) * 12);
      const refused = results.filter((r) => r.isError);
      refusedCount = refused.length;
      expect(results.length - refused.length).toBeLessThanOrEqual(11 + refilled); // 12 minus the load
      expect(refused.length).toBeGreaterThanOrEqual(9 - refilled);
      expect(refused.length).toBeGreaterThan(0);
      for (const r of refused) expect(errorOf(r)?.code).toBe("rate_limited");
      const dataDir = dataDirOf(config);
      // An answered call has both records; of the refused ones, the first is recorded at once
      // and the others are counted into one aggregate (written when the server closes).
      const recorded = results.map((r, i) => {
        const outcomes = outcomesFor(dataDir, argsDigest("run_inference", input(i)));
        if (!r.isError) expect(outcomes).toEqual(["allowed", "executed"]);
        else expect(outcomes.length).toBeLessThanOrEqual(1);
        return r.isError ? outcomes.length : 0;
      });
      expect(recorded.reduce((a, b) => a + b, 0)).toBe(1);
    } finally {
      await conn.close();
    }
    const limited = readPolicyDb(dataDirOf(config), (db) =>
      (
        db
          .prepare(
            "SELECT json_extract(record, '$.count') AS n FROM audit_log WHERE json_extract(record, '$.code') = 'rate_limited'",
          )
          .all() as { n: number | null }[]
      ).map((r) => r.n ?? 1),
    );
    expect(limited.length).toBe(Math.min(2, refusedCount));
    expect(limited.reduce((a, b) => a + b, 0)).toBe(refusedCount);
  });

  it("charges every answered call once and no refused one, and refuses once the budget is spent", async () => {
    // Over HTTP with two principals: the loader's measured load is charged to its own budget
    // line, so the agent's budget holds inference alone. The budget is a cap for the load too (it
    // is stopped at the line), so the line is four times what a quiet machine's cold load needs,
    // scaled with the machine's slowdown (whose calibration stops at ×12: at load 15 a line of
    // 1.5 s × 12 stopped the load at 18 s).
    // The agent spent all but LEFT_S of it earlier in the window (a charge planted before the
    // start, as a restarted server finds it): twice as many estimates as that, however slow the
    // machine (scaling the calls with it sent thousands at once, refused by the queue, not the
    // budget).
    const budgetS = Math.round(6000 * slowdown()) / 1000;
    const LEFT_S = Math.min(1.5, budgetS);
    const calls = Math.ceil((2 * LEFT_S) / 0.01);
    const scopes = ["models:read", "models:load", "inference:run"];
    const config = writeConfig(
      {
        policy: {
          tokens: [
            { id: "loader", token_sha256: hashToken("fast-loader"), scopes },
            { id: "agent", token_sha256: hashToken("fast-agent"), scopes },
          ],
          limits: {
            rate_limit: { per_principal_per_minute: 6000 },
            // Every call may wait for the device: a refusal here is the budget's, not the queue's.
            queue_bound: { run_inference: calls },
            device_queue_bound: calls,
            // device-seconds; the estimate of one mnist-cnn call is 0.01
            budget: { device_seconds_per_window: budgetS, window_s: 3600 },
          },
        },
      },
      mkdtempSync(join(tmpdir(), "tpu-mcp-fast-budget-")),
    );
    // The loader's load is a fresh worker's first model build, a cold load (issue 33), priced
    // from the cold loads measured before (a deployment that ran has them) or else at a floor
    // above this line: one measured at a third of the line, so it is admitted (and, like any
    // call, stopped at the line should it run longer).
    plantColdLoad(dataDirOf(config), "mnist-cnn", budgetS / 3);
    plantSpent(dataDirOf(config), "agent", budgetS - LEFT_S);
    const server = await startHttpServer(config);
    const loader = await connectHttp(server.url, "fast-loader");
    const conn = await connectHttp(server.url, "fast-agent");
    try {
      const loaded = await call(loader.client, "load_model", { model: "mnist-cnn" });
      expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
      const results = await Promise.all(
        Array.from({ length: calls }, (_, i) => call(conn.client, "run_inference", input(i))),
      );
      const answered = results.filter((r) => !r.isError);
      const refused = results.filter((r) => r.isError);
      // Admission reserves each call's estimate: at most budgetS / 0.01 before any settles.
      expect(answered.length).toBeGreaterThan(0);
      expect(refused.length).toBeGreaterThan(0);
      for (const r of refused) expect(errorOf(r)?.code).toBe("budget_exceeded");
      const countCharges = () =>
        readPolicyDb(
          dataDirOf(config),
          (db) =>
            (
              db
                .prepare("SELECT COUNT(*) AS c FROM budget_charges WHERE tool = 'run_inference'")
                .get() as { c: number }
            ).c,
        );
      // A call admitted and then stopped by the cap (issue 22: it ran past what the budget had
      // left) is charged what it used and answered budget_exceeded with stopped_after_s.
      // A call stopped while still queued used nothing and has no charge row (a charge of 0 is
      // not written), so the rows lie between the answered calls plus the stopped ones that ran
      // and the answered plus every stopped one (at load 12: 50 rows for 74 answered and stopped).
      const stopped = refused.filter((r) => errorOf(r)?.details?.stopped_after_s !== undefined);
      const ran = stopped.filter((r) => errorOf(r)!.details.stopped_after_s > 0);
      const least = answered.length + ran.length;
      const most = answered.length + stopped.length;
      // The rows are written in batches after the answers (a few may still be pending when the
      // last answer arrives): wait for them, then none more may come.
      const written = Date.now() + scaled(5_000);
      while (countCharges() < least && Date.now() < written)
        await new Promise((r) => setTimeout(r, 50));
      await new Promise((r) => setTimeout(r, 200));
      expect(countCharges()).toBeGreaterThanOrEqual(least);
      expect(countCharges()).toBeLessThanOrEqual(most);
      // Spent: calls keep being refused (after at most the few the rest of the budget admits).
      let code: string | undefined;
      for (let i = 0; i < 10 && code === undefined; i++)
        code = errorOf(await call(conn.client, "run_inference", input(1000 + i)))?.code;
      expect(code).toBe("budget_exceeded");
    } finally {
      await conn.close();
      await loader.close();
      await server.stop();
    }
  });
});
