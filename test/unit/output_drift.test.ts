// The server checks every answer against the tool's own output schema before it leaves: a drifted
// handler (a mistyped or missing field, a wrong shape) answers `internal` and is logged with the
// tool's name, never delivered as a silent wrong answer. Fields the schema does not name pass,
// as the published (open) output schema promises.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { dispatchTool, ERROR_META_KEY } from "../../tools/dispatch/dispatch.js";
import { JobRef, SqliteJobs } from "../../tools/stores/jobs.js";
import { defineTool, type ToolServices } from "../../tools/types.js";

const Out = z.object({ count: z.number().int(), items: z.array(z.object({ id: z.string() })) });

function toolAnswering(answer: unknown, job = false) {
  return defineTool(
    {
      name: "drift_probe",
      scope: "models:read",
      workerOp: null,
      job,
      deviceMode: null,
      timeoutS: null,
      concurrency: null,
      estimate: null,
      runWhileRecording: false,
    },
    {
      title: "drift probe",
      description: "answers whatever the test says",
      input: z.object({ wait: z.boolean().optional() }).strict(),
      // A job tool answers its result or a job reference (run_benchmark's and load_model's way).
      output: job ? z.union([Out, JobRef]) : Out,
      annotations: {
        readOnlyHint: true,
        destructiveHint: false,
        idempotentHint: true,
        openWorldHint: false,
      },
      handler: async () => answer as z.infer<typeof Out>,
      render: () => "ok",
    },
  );
}

async function call(answer: unknown, job?: { jobs: SqliteJobs }) {
  const logs: Record<string, unknown>[] = [];
  const logger = pino(
    { level: "info" },
    { write: (line: string) => void logs.push(JSON.parse(line) as Record<string, unknown>) },
  );
  const outcome = await dispatchTool({
    tool: toolAnswering(answer, job !== undefined),
    rawArgs: job ? { wait: false } : {},
    principal: { id: "p", scopes: ["admin"], via: "stdio" },
    gate: {
      enforceScope: async () => {},
      refuse: async () => {},
      run: ((_call: unknown, fn: (s: AbortSignal) => Promise<unknown>) =>
        fn(new AbortController().signal)) as never,
    },
    // A tool with no worker op: placement is asked for but never used.
    base: {
      runtime: { place: () => ({ lane: undefined, ran: () => [] }) },
      env: { catalog: { models: [] } },
      ...(job ? { jobs: job.jobs } : {}),
    } as unknown as ToolServices,
    signal: new AbortController().signal,
    progress: () => {},
    logger,
  });
  if (outcome.kind === "input_required") throw new Error("no approval is asked here");
  return { result: outcome.result, logs };
}

describe("output validation in dispatch", () => {
  it("answers a conforming result as the handler returned it, extra fields included", async () => {
    const ok = { count: 1, items: [{ id: "a", note: "more" }], extra: true };
    const { result } = await call(ok);
    expect(result.isError).toBeUndefined();
    expect(result.structuredContent).toEqual(ok);
  });

  it.each([
    ["a mistyped field", { count: "1", items: [] }, "count"],
    ["a missing field", { count: 1 }, "items"],
    ["a mistyped nested field", { count: 1, items: [{ id: 7 }] }, "items.0.id"],
    ["a count that is not an integer", { count: 1.5, items: [] }, "count"],
    ["no object at all", "done", "(result)"],
  ])("refuses %s with internal and logs the tool and the field", async (_what, answer, field) => {
    const { result, logs } = await call(answer);
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toBeUndefined();
    expect((result._meta?.[ERROR_META_KEY] as { code: string }).code).toBe("internal");
    const drift = logs.find((l) => l.msg === "tool output does not match its output schema");
    expect(drift?.tool).toBe("drift_probe");
    expect(JSON.stringify(drift?.problems)).toContain(field);
  });
});

describe("output validation of job results (what get_job serves)", () => {
  const dir = mkdtempSync(join(tmpdir(), "tpu-mcp-drift-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it.each([
    ["a conforming result", { count: 1, items: [{ id: "a" }] }, "succeeded"],
    ["a drifted result", { count: "1", items: [] }, "failed"],
  ])("checks %s of a job against the tool's output schema", async (_what, answer, status) => {
    const jobs = new SqliteJobs(join(dir, `jobs-${status}.db`));
    try {
      const { result, logs } = await call(answer, { jobs });
      const jobId = result.structuredContent?.job_id as string;
      expect(jobId).toMatch(/^job_/);
      await jobs.settled(jobId);
      const job = (await jobs.get(jobId, "p"))!;
      expect(job.status).toBe(status);
      if (status === "succeeded") expect(job.result).toEqual(answer);
      else {
        expect(job.result).toBeNull();
        expect(job.error?.code).toBe("internal");
        const drift = logs.find((l) => l.msg === "tool output does not match its output schema");
        expect(drift?.tool).toBe("drift_probe");
      }
    } finally {
      jobs.close();
    }
  });
});
