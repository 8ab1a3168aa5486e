// Worker-level A/B of the infer path, without MCP: WorkerRuntime straight to two workers — this
// checkout and another checkout (e.g. the previous commit) — on mnist-cnn batch 1. Each round
// runs 32 concurrent callers (calls/s and requests per forward) then 100 lone calls (p50), the
// two workers in rotating order so a noisy machine's drift hits them alike.
//
//   npx tsx bench/ab_worker.ts <other checkout> [rounds]
// The other checkout needs its own `node scripts/setup.mjs --dev` (it uses this catalog).
import { join } from "node:path";
import { WorkerRuntime } from "../runtime/client.js";
import { quietLogger } from "./concurrency.js";
import { PYTHON, ROOT } from "./lib/procs.js";
import { workerThreads } from "../server/app/build_runtime.js";

const other = process.argv[2];
const rounds = Number(process.argv[3] ?? 4);
if (!other) throw new Error("usage: npx tsx bench/ab_worker.ts <other checkout> [rounds]");
const catalogPath = join(ROOT, "runtime", "catalog.builtin.json");
const mk = (repoRoot: string) =>
  new WorkerRuntime({
    repoRoot,
    pythonPath: PYTHON,
    catalogPath,
    device: "cpu",
    // The thread count the server gives its worker (server/app/build_runtime.ts), as on the MCP sides.
    extraArgs: ["--threads", String(workerThreads(0))],
    logger: quietLogger,
    env: process.env,
  });
const sides = {
  this: mk(ROOT),
  other: mk(other),
};
type Side = keyof typeof sides;
const names = Object.keys(sides) as Side[];
const x = [
  {
    dtype: "float32" as const,
    shape: [1, 1, 28, 28],
    data: Buffer.from(new Float32Array(784).fill(0.5).buffer),
  },
];
const infer = (rt: WorkerRuntime) =>
  rt.call<{ batched_with: number }>("infer", { model: "mnist-cnn" }, { tensors: x });

async function concurrent(rt: WorkerRuntime, callers: number, n: number) {
  let next = 0;
  const per: number[] = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next++ < n) per.push((await infer(rt)).result.batched_with);
    }),
  );
  return { rate: n / ((performance.now() - t0) / 1000), per: per.reduce((a, b) => a + b) / n };
}

async function lone(rt: WorkerRuntime, n: number) {
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await infer(rt);
    ms.push(performance.now() - t0);
  }
  return ms.sort((a, b) => a - b)[Math.floor(n / 2)];
}

try {
  for (const s of names) {
    await sides[s].start();
    await sides[s].call("load", { model: "mnist-cnn" });
    await concurrent(sides[s], 32, 200); // warm-up
  }
  process.stdout.write(`ab_worker — ${new Date().toISOString()} — mnist-cnn batch 1\n`);
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < names.length; k++) {
      const s = names[(r + k) % names.length];
      const c = await concurrent(sides[s], 32, 1000);
      const p50 = await lone(sides[s], 100);
      process.stdout.write(
        `round ${r + 1} ${s.padEnd(11)} 32 callers ${c.rate.toFixed(0).padStart(5)} calls/s, ` +
          `${c.per.toFixed(1)} requests per forward; lone p50 ${p50.toFixed(2)} ms\n`,
      );
    }
  }
} finally {
  await Promise.allSettled(names.map((s) => sides[s].close()));
}
