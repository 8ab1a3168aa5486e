// 5. Memory: server and worker RSS (VmRSS) before and after 10,000 small run_inference calls
// over stdio, sent by 16 concurrent callers. The calls are mnist-cnn batch-1 tensors (3 KiB in,
// 10 logits out): the cheapest forward, so the 10,000 calls exercise the serving path (MCP,
// gate, audit, pipe, batcher) rather than the model, in seconds rather than minutes. "Before" is taken after a warm-up so one-time
// allocations (first forward, JIT, pools) do not count as growth; RSS is also sampled along
// the way so a plateau can be told from a steady leak.
import { rssBytes, type McpServer } from "./lib/procs.js";
import { section, type SectionResult } from "./lib/report.js";
import { fmt, withCallers } from "./lib/stats.js";

export interface MemoryOptions {
  mcp: McpServer; // mnist-cnn loaded
  workerPid: number;
  calls: number;
  callers: number;
  warmup: number;
}

export async function runMemory(o: MemoryOptions): Promise<SectionResult> {
  const s = section("memory");
  // Vary the input a little per call so nothing upstream can cache a reply.
  const image = (i: number) => Array.from({ length: 784 }, (_, k) => ((k * 31 + i) % 97) / 97);
  const call = (i: number) =>
    o.mcp.call("run_inference", {
      model: "mnist-cnn",
      tensors: [{ dtype: "float32", shape: [1, 1, 28, 28], data: image(i) }],
    });
  await withCallers(o.callers, o.warmup, async (i) => void (await call(i)));
  const read = () => ({ server: rssBytes(o.mcp.pid), worker: rssBytes(o.workerPid) });
  const before = read();
  const samples: Array<{ calls: number; server: number; worker: number }> = [
    { calls: 0, ...before },
  ];
  const every = Math.ceil(o.calls / 5);
  const t0 = performance.now();
  let done = 0;
  await withCallers(o.callers, o.calls, async (i) => {
    await call(i);
    if (++done % every === 0) samples.push({ calls: done, ...read() });
  });
  const seconds = (performance.now() - t0) / 1000;
  const after = read();
  for (const p of ["server", "worker"] as const) {
    const growth = after[p] / before[p] - 1;
    s.row(
      `${p} RSS over ${o.calls} calls`,
      fmt.pct(growth),
      `${fmt.bytes(before[p])} → ${fmt.bytes(after[p])}; samples ${samples.map((x) => fmt.bytes(x[p])).join(", ")}`,
    );
    s.fig(`${p}_rss_before_bytes`, before[p]);
    s.fig(`${p}_rss_after_bytes`, after[p]);
    s.fig(`${p}_rss_growth`, growth);
  }
  s.row("calls per second", fmt.rate(o.calls / seconds), `${o.callers} callers, mnist-cnn batch 1`);
  s.fig("calls_per_s", o.calls / seconds);
  return s.result();
}
