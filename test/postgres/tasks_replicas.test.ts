// MCP Tasks across replicas on one Postgres (2026-07-28, the Tasks client over raw HTTP to each
// replica's own /mcp): a task started on one replica is answered by another, and when the
// replica running it is killed (SIGKILL) the task is still answered, by another replica, as
// failed once its lease has run out: never lost, never left "working". The server decides when
// a call is a task in this era: these benchmarks run past a short hand-off bound.
import { Client } from "@modelcontextprotocol/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scaled } from "../helpers/calibrate.js";
import { startDeployment, type Deployment } from "../helpers/replicas.js";
import { DEMO_POLICY, DEMO_TOKENS } from "../helpers/server.js";
import { connectModernHttp } from "../helpers/modern.js";
import { httpDispatch, modernTasks } from "../helpers/tasks.js";

const POLICY = {
  ...DEMO_POLICY,
  limits: {
    ...DEMO_POLICY.limits,
    rate_limit: { per_principal_per_minute: 6000 },
    soft_deadline_s: 2,
  },
  approvals: { rules: [] },
};

let d: Deployment;
const clients: Client[] = [];
async function tasksOn(url: string) {
  const c = await connectModernHttp(url, DEMO_TOKENS.agent);
  clients.push(c.client);
  return modernTasks(c.client, httpDispatch(url, DEMO_TOKENS.agent));
}

beforeAll(async () => {
  // A short lease, so a killed replica's task is known lost within seconds.
  d = await startDeployment({ policy: POLICY, replicas: 2, postgres: { job_lease_s: 3 } });
});
afterAll(async () => {
  for (const c of clients) await c.close().catch(() => {});
  await d?.stop();
});

describe("MCP Tasks on Postgres replicas", () => {
  it("a task started on one replica is polled and its result fetched on another", async () => {
    const [a, b] = d.replicas;
    const onA = await tasksOn(a!.url);
    const onB = await tasksOn(b!.url);
    const ex = await onA.callTool("run_benchmark", {
      model: "mnist-cnn",
      batch_sizes: [1, 2, 4, 8],
      iterations: 1500,
      warmup: 1,
    });
    expect(ex.kind).toBe("task");
    const taskId = ex.handle!.taskId;
    const outcome = await onB.task(taskId).result();
    expect(outcome.status).toBe("completed");
    expect((outcome as any).result.structuredContent.model).toBe("mnist-cnn");
  });

  it("a replica killed mid-task: another replica answers the task, failed once its lease ran out", async () => {
    const [a, b] = d.replicas;
    const onA = await tasksOn(a!.url);
    const onB = await tasksOn(b!.url);
    const ex = await onA.callTool("run_benchmark", {
      model: "tiny-gpt2",
      batch_sizes: [1, 2, 4, 8],
      iterations: 10000,
      warmup: 1,
    });
    expect(ex.kind).toBe("task");
    const taskId = ex.handle!.taskId;
    expect((await onB.task(taskId).snapshot()).status).toBe("working");
    await a!.kill9();
    try {
      const end = Date.now() + scaled(60_000);
      let last = await onB.task(taskId).snapshot();
      while (last.status === "working" && Date.now() < end) {
        await new Promise((r) => setTimeout(r, 500));
        last = await onB.task(taskId).snapshot();
      }
      expect(last.status).toBe("failed");
      expect(last.statusMessage).toMatch(/worker_died: the replica running this job stopped/);
    } finally {
      await a!.start();
    }
  });
});
