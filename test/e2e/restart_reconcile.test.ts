// Issue 33, minor row 8: `kill -9` of the server while an approved benchmark runs as a job. The
// next start, on the same data dir, settles the call before it serves anyone: an `interrupted`
// record after its `allowed` one, the device time charged (to the server's last heartbeat), and
// the approval usable again for the same arguments until it expires; a second restart charges
// nothing more. A real HTTP server and worker, the SDK's real client, the operator CLI.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HEARTBEAT_MS } from "../../policies/calls_in_flight.js";
import { recordFigure } from "../hardening/helpers.js";
import { charges } from "../helpers/budget_cap.js";
import { scaled } from "../helpers/calibrate.js";
import {
  cli,
  connectHttp,
  DEMO_POLICY,
  DEMO_TOKENS,
  errorOf,
  startHttpServer,
  writeConfig,
  type HttpServerProc,
} from "../helpers/server.js";
import { call } from "./scenario.js";

const { agent: AGENT, operator: OPERATOR } = DEMO_TOKENS;
/** A second agent with the same scopes: the given-back approval is not theirs. */
const OTHER = "restart-other-agent-token";
const POLICY = {
  ...DEMO_POLICY,
  tokens: [
    ...DEMO_POLICY.tokens,
    {
      id: "other-agent",
      token_sha256: createHash("sha256").update(OTHER).digest("hex"),
      scopes: DEMO_POLICY.tokens.find((t: { id: string }) => t.id === "agent").scopes,
    },
  ],
};
/** Long enough never to end by itself before the kill (the demo policy asks approval for it). */
const LONG = { model: "tiny-gpt2", batch_sizes: [1], seq_lens: [8], duration_s: 300 };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until<T>(fn: () => Promise<T | undefined> | T | undefined, ms: number): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() - t0 > ms) throw new Error(`condition not met within ${ms} ms`);
    await sleep(200);
  }
}

/** Every process below `pid` (the worker and anything it started). */
function descendants(pid: number): number[] {
  let out = "";
  try {
    out = execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)], { encoding: "utf8" });
  } catch {
    return []; // ps exits 1 when there are none
  }
  const kids = out.split(/\s+/).filter(Boolean).map(Number);
  return kids.flatMap((k) => [k, ...descendants(k)]);
}
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

interface Rec {
  seq: number;
  outcome: string;
  tool: string;
  approval_id?: string;
  args_digest?: string;
  duration_ms?: number;
  reason?: string;
}
async function auditTail(config: string): Promise<Rec[]> {
  const r = await cli(config, "audit", "tail", "-n", "200", "--json");
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as Rec[];
}

describe("a server killed mid-job settles the job at its next start", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-restart-"));
  const dataDir = join(dir, "data");
  const config = writeConfig({ policy: POLICY }, dir);
  let server: HttpServerProc | undefined;
  const leftovers: number[] = [];
  let approvalId = "";
  let jobId = "";
  let chargedBefore: number[] = [];
  let workerExitMs = -1;

  beforeAll(async () => {
    server = await startHttpServer(config);
    const agent = await connectHttp(server.url, AGENT);
    try {
      const load = await call(agent.client, "load_model", { model: "tiny-gpt2" });
      expect(load.isError, JSON.stringify(load)).toBeFalsy();
      const asked = await call(agent.client, "run_benchmark", { ...LONG, wait: false });
      expect(errorOf(asked)?.code, JSON.stringify(asked)).toBe("approval_required");
      approvalId = errorOf(asked)!.details.approval_id;
      const ok = await cli(config, "approvals", "approve", approvalId, "--token", OPERATOR);
      expect(ok.code, ok.stderr).toBe(0);
      const started = await call(agent.client, "run_benchmark", {
        ...LONG,
        wait: false,
        approval_id: approvalId,
      });
      jobId = started.structuredContent?.job_id;
      expect(jobId, JSON.stringify(started)).toMatch(/^job_/);
      // Running on the worker (not waiting for a slot), and past a few heartbeats.
      await until(async () => {
        const j = await call(agent.client, "get_job", { job_id: jobId });
        const s = j.structuredContent;
        return s?.status === "running" && !/waiting to start/.test(s?.message ?? "")
          ? s
          : undefined;
      }, scaled(120_000));
      await sleep(3 * HEARTBEAT_MS);
    } finally {
      await agent.close().catch(() => {});
    }
    chargedBefore = charges(dataDir, "agent");
    const pid = server.proc.pid!;
    const below = descendants(pid);
    expect(below.length, "the server runs a worker").toBeGreaterThan(0);
    const exited = new Promise((r) => server!.proc.once("exit", r));
    process.kill(pid, "SIGKILL");
    await exited;
    server = undefined;
    // Its worker sees its stdin close and exits; one that did not would be a leak (killed here).
    const killedAt = Date.now();
    try {
      await until(() => (below.some(alive) ? undefined : true), scaled(30_000));
      workerExitMs = Date.now() - killedAt;
    } catch {
      for (const p of below.filter(alive)) {
        leftovers.push(p);
        process.kill(p, "SIGKILL");
      }
    }
    server = await startHttpServer(config);
  }, scaled(400_000));

  afterAll(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("the killed server's worker exited with it", () => {
    expect(leftovers).toEqual([]);
  });

  it("records the call interrupted after its allowed record, and charges its device time once", async () => {
    const recs = await auditTail(config);
    const ours = recs.filter((r) => r.approval_id === approvalId && r.tool === "run_benchmark");
    const allowed = ours.filter((r) => r.outcome === "allowed");
    const interrupted = ours.filter((r) => r.outcome === "interrupted");
    expect(allowed).toHaveLength(1);
    expect(interrupted).toHaveLength(1);
    expect(interrupted[0]!.seq).toBeGreaterThan(allowed[0]!.seq);
    expect(interrupted[0]!.args_digest).toBe(allowed[0]!.args_digest);
    expect(ours.filter((r) => ["executed", "failed"].includes(r.outcome))).toEqual([]);
    expect(interrupted[0]!.reason).toMatch(/last heartbeat/);
    expect(interrupted[0]!.reason).toContain(`Approval ${approvalId} is usable again`);
    // The charge is the record's figure, measured to a heartbeat after the work had run a while.
    const charged = interrupted[0]!.duration_ms! / 1000;
    recordFigure("restart_reconcile_charged_s", { charged, workerExitMs });
    expect(charged).toBeGreaterThanOrEqual((2 * HEARTBEAT_MS) / 1000);
    const after = charges(dataDir, "agent");
    expect(after.slice(0, chargedBefore.length)).toEqual(chargedBefore);
    expect(after.slice(chargedBefore.length)).toEqual([charged]);

    // The job says it was interrupted.
    const agent = await connectHttp(server!.url, AGENT);
    try {
      const job = await call(agent.client, "get_job", { job_id: jobId });
      expect(job.structuredContent?.status).toBe("interrupted");
    } finally {
      await agent.close();
    }

    // A second restart finds nothing to settle: no second record, no second charge.
    await server!.stop();
    server = undefined;
    server = await startHttpServer(config);
    const again = (await auditTail(config)).filter((r) => r.outcome === "interrupted");
    expect(again).toHaveLength(1);
    expect(charges(dataDir, "agent")).toEqual(after);
  });

  it("gives the approval back for the same arguments only", async () => {
    const agent = await connectHttp(server!.url, AGENT);
    try {
      // Another principal with the same arguments: the given-back approval is not theirs.
      const other = await connectHttp(server!.url, OTHER);
      try {
        const theirs = await call(other.client, "run_benchmark", {
          ...LONG,
          wait: false,
          approval_id: approvalId,
        });
        expect(errorOf(theirs)?.code, JSON.stringify(theirs)).toBe("approval_not_found");
      } finally {
        await other.close();
      }
      // Other arguments: that approval is not theirs, and without it they need their own.
      const otherArgs = { ...LONG, duration_s: 200 };
      const mismatch = await call(agent.client, "run_benchmark", {
        ...otherArgs,
        approval_id: approvalId,
      });
      expect(errorOf(mismatch)?.code, JSON.stringify(mismatch)).toBe("approval_mismatch");
      const asked = await call(agent.client, "run_benchmark", { ...otherArgs, wait: false });
      expect(errorOf(asked)?.code).toBe("approval_required");
      expect(errorOf(asked)!.details.approval_id).not.toBe(approvalId);

      // The same arguments run on the given-back approval, without asking anyone.
      const rerun = await call(agent.client, "run_benchmark", {
        ...LONG,
        wait: false,
        approval_id: approvalId,
      });
      const id = rerun.structuredContent?.job_id;
      expect(id, JSON.stringify(rerun)).toMatch(/^job_/);
      await call(agent.client, "cancel_job", { job_id: id });
      await until(async () => {
        const j = await call(agent.client, "get_job", { job_id: id });
        return j.structuredContent?.status !== "running" ? true : undefined;
      }, scaled(60_000));
      // Used once more, and no more. (A cancel the benchmark does not stop in its grace ends
      // the worker: until its replacement is up a call is refused worker_unavailable, which says
      // nothing of the approval; seen on a loaded machine.)
      let third: Awaited<ReturnType<typeof call>>;
      await until(async () => {
        third = await call(agent.client, "run_benchmark", { ...LONG, approval_id: approvalId });
        return errorOf(third)?.code === "worker_unavailable" ? undefined : true;
      }, scaled(60_000));
      expect(errorOf(third!)?.code).toBe("approval_used");
    } finally {
      await agent.close();
    }
  });
});
