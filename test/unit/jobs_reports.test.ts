// Jobs answer errors through the same catalogue and redaction as tool answers, and generated
// benchmark runs never feed forward-pass latency history.
import Database from "better-sqlite3";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { SqliteJobs } from "../../tools/stores/jobs.js";
import { SqliteReports } from "../../tools/stores/reports.js";
import { measured } from "../../tools/support/estimate.js";

const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-jobs-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("job errors", () => {
  it("stores a catalogue code and a scrubbed message, never a raw code or a path", async () => {
    const logged: unknown[] = [];
    const jobs = new SqliteJobs(join(dir, "jobs.db"), { onError: (e) => logged.push(e) });
    try {
      const raw = await jobs.start("load_model", "p", async () => {
        throw Object.assign(
          new Error("ENOENT: no such file, open '/home/op/.cache/models/x.bin'"),
          {
            code: "ENOENT",
          },
        );
      });
      await jobs.settled(raw.job_id);
      const rec = (await jobs.get(raw.job_id, "p"))!;
      expect(rec.status).toBe("failed");
      expect(rec.error!.code).toBe("internal");
      expect(rec.error!.message).not.toMatch(/home|ENOENT|x\.bin/);
      expect(logged).toHaveLength(1); // the operator still sees the real error in the log

      const known = await jobs.start("load_model", "p", async () => {
        throw Object.assign(new Error("weights at /srv/a/b/c.safetensors are bad"), {
          code: "weights_missing",
        });
      });
      await jobs.settled(known.job_id);
      const k = (await jobs.get(known.job_id, "p"))!;
      expect(k.error!.code).toBe("weights_missing");
      expect(k.error!.message).toBe("weights at <path> are bad");
    } finally {
      jobs.close();
    }
  });
});

describe("latency history", () => {
  it("ignores generated runs, whether the work is on each configuration or on the report", async () => {
    const reports = new SqliteReports(join(dir, "reports.db"));
    try {
      const cfg = { batch: 1, seq_len: 8, dtype: "float32", mode: "eager", error: null };
      await reports.put("p", "tiny-gpt2", "cpu", {
        work: "generate",
        configs: [{ ...cfg, latency_ms: { mean: 900 } }],
      });
      await reports.put("p", "tiny-gpt2", "cpu", {
        configs: [{ ...cfg, work: "generate", latency_ms: { mean: 800 } }],
      });
      expect(await reports.history("tiny-gpt2", "cpu")).toEqual([]);
      await reports.put("p", "tiny-gpt2", "cpu", {
        work: "forward",
        configs: [{ ...cfg, latency_ms: { mean: 3 } }],
      });
      expect((await reports.history("tiny-gpt2", "cpu")).map((h) => h.latency_ms)).toEqual([3]);
    } finally {
      reports.close();
    }
  });
});

describe("measured calls", () => {
  it("keeps the newest calls per model and device kind, in memory at once and on disk by close", async () => {
    const file = join(dir, "calls.db");
    const call = (seconds: number, items: number, model = "mnist-cnn") => ({
      kind: "inference" as const,
      model,
      device: "cpu",
      work: { items, seq: 1, max_new_tokens: 0, mode: "eager", cold: false },
      seconds,
      at: 1000,
    });
    const first = new SqliteReports(file);
    for (let i = 1; i <= 205; i++) await first.recordCall(call(i, i));
    await first.recordCall(call(7, 1, "tiny-gpt2"));
    // Estimates see a call as soon as it is recorded, newest first, at most 200 of them.
    const mem = await first.calls("mnist-cnn", "cpu");
    expect(mem).toHaveLength(200);
    expect(mem[0].seconds).toBe(205);
    // Of one work, only the newest three (an estimate reads no more on the hot path).
    for (const s of [1000, 1001, 1002, 1003]) await first.recordCall(call(s, 5));
    const fives = (await first.calls("mnist-cnn", "cpu")).filter((c) => c.work.items === 5);
    expect(fives.map((c) => c.seconds)).toEqual([1003, 1002, 1001]);
    const kept = (await first.calls("mnist-cnn", "cpu")).map((c) => c.seconds);
    first.close();
    // A restart keeps them (close writes what the timer had not yet).
    const again = new SqliteReports(file);
    try {
      const disk = await again.calls("mnist-cnn", "cpu");
      expect(disk.map((c) => c.seconds)).toEqual(kept);
      expect(disk[0].work).toEqual(call(1003, 5).work);
      expect((await again.calls("tiny-gpt2", "cpu")).map((c) => c.seconds)).toEqual([7]);
      expect(await again.calls("mnist-cnn", "cuda")).toEqual([]);
    } finally {
      again.close();
    }
  });

  it("opens a table of measured calls from before estimates were kept with them", async () => {
    const file = join(dir, "old-calls.db");
    const old = new Database(file);
    old.exec(`CREATE TABLE measured_calls (
      id INTEGER PRIMARY KEY, model TEXT NOT NULL, device TEXT NOT NULL, kind TEXT NOT NULL,
      work TEXT NOT NULL, seconds REAL NOT NULL, at INTEGER NOT NULL)`);
    old
      .prepare(
        "INSERT INTO measured_calls (model, device, kind, work, seconds, at) VALUES (?, ?, ?, ?, ?, ?)",
      )
      .run("m", "cpu", "check", JSON.stringify({ batch: 1 }), 0.5, 1000);
    old.close();
    const reports = new SqliteReports(file);
    try {
      expect((await reports.calls("m", "cpu")).map((c) => [c.seconds, c.estimate_s])).toEqual([
        [0.5, undefined],
      ]);
    } finally {
      reports.close();
    }
  });

  it("keeps what a call took, but not a call stopped or cancelled with a partial result", async () => {
    const reports = new SqliteReports(join(dir, "measured.db"));
    const work = { kind: "benchmark" as const, model: "mnist-cnn", device: "cpu", work: { n: 1 } };
    try {
      const done = new AbortController();
      expect(
        await measured(
          () => work,
          { reports, signal: done.signal },
          async () => "all",
        ),
      ).toBe("all");
      expect(await reports.calls("mnist-cnn", "cpu")).toHaveLength(1);
      // The gate stops the call (budget, call_timeout_s) by aborting its signal; the work then
      // answers what it measured so far: that answer is kept, its seconds are not learned.
      const stopped = new AbortController();
      const partial = await measured(
        () => work,
        { reports, signal: stopped.signal },
        async () => {
          stopped.abort(new Error("budget"));
          return "partial";
        },
      );
      expect(partial).toBe("partial");
      expect(await reports.calls("mnist-cnn", "cpu")).toHaveLength(1);
    } finally {
      reports.close();
    }
  });
});
